#!/usr/bin/env bash
# Builds Kubernetes v1.20.2 binaries from Debian's `kubernetes` source package, and makes etcd available,
# into $1/bin (default ~/.cache/phalanx/k8s-1.20.2). The binaries to build follow $1 (default: the control
# plane, kube-apiserver kube-scheduler kube-controller-manager kubectl; a real node adds kubelet kube-proxy),
# all in one `make`. Called by `phalanx dev install`, which passes the Debian mirror of the machine's own apt
# sources in $PHALANX_DEBIAN_MIRROR; safe to re-run (finished steps are skipped).
set -euo pipefail

DEST=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s-1.20.2}
WORK=${PHALANX_BUILD_DIR:-$(dirname "$DEST")/build}
shift || true
BINARIES=("$@")
[ ${#BINARIES[@]} -gt 0 ] || BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl)
step() { printf '[phalanx install] %s\n' "$*"; }

mkdir -p "$DEST/bin" "$WORK"

if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else SUDO=""; fi
need_pkgs=()
for pkg in golang-go rsync jq etcd-server golang-github-modern-go-reflect2-dev debian-archive-keyring; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  step "installing Debian packages: ${need_pkgs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
ln -sfn /usr/bin/etcd "$DEST/bin/etcd"

missing=0
for b in "${BINARIES[@]}"; do [ -x "$DEST/bin/$b" ] || missing=1; done
if [ $missing = 0 ]; then step "${BINARIES[*]} already built in $DEST/bin"; exit 0; fi

APT="$WORK/apt"
mkdir -p "$APT/lists/partial"
O=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$APT" -o "Dir::State::Lists=$APT/lists")
if ! ls "$WORK"/kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
  if [ -z "${PHALANX_DEBIAN_MIRROR:-}" ]; then
    echo "[phalanx install] PHALANX_DEBIAN_MIRROR is not set: run this through \`phalanx dev install\`, which reads it from apt's sources" >&2
    exit 2
  fi
  cat > "$APT/src.sources" <<SRC
Types: deb-src
URIs: $PHALANX_DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  step "downloading Debian's kubernetes source package"
  apt-get "${O[@]}" update -qq
  (cd "$WORK" && apt-get "${O[@]}" source --download-only kubernetes >/dev/null)
fi
SRC_DIR="$WORK/kubernetes-1.20.2"
if [ ! -f "$SRC_DIR/.phalanx-prepared" ]; then
  step "unpacking sources"
  rm -rf "$SRC_DIR"
  tar xzf "$WORK"/kubernetes_*.orig.tar.gz -C "$WORK"
  # Go >= 1.18 with the vendored reflect2 v1.0.1 segfaults the apiserver on its first CRD: use 1.0.2.
  rm -rf "$SRC_DIR/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$SRC_DIR/vendor/github.com/modern-go/reflect2"
  mkdir -p "$SRC_DIR/.go/src/k8s.io"
  ln -sfn ../../.. "$SRC_DIR/.go/src/k8s.io/kubernetes"
  touch "$SRC_DIR/.phalanx-prepared"
fi
step "compiling ${BINARIES[*]} (7-12 minutes on 2 cores)"
cd "$SRC_DIR"
export GOPATH=$SRC_DIR/.go CGO_ENABLED=0 GOCACHE=$WORK/gocache GOFLAGS=-mod=vendor
HOME=$WORK/home make WHAT="${BINARIES[*]/#/cmd/}"
for b in "${BINARIES[@]}"; do install -m 0755 "_output/bin/$b" "$DEST/bin/$b"; done
# The sources and Go cache take about 2.5 GB; the binaries are all that is needed from now on.
rm -rf "$SRC_DIR" "$WORK/gocache" "$WORK/home"
step "done: $DEST/bin"

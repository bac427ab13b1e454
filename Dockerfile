# Two images from one Dockerfile: the operator (extra `operator`: kopf, no torch) and the worker (extras
# `worker` and `s3`: torch, no kopf). The default target is the operator.
#
# With a container registry and a Python package index at hand:
#   docker build -t phalanx:0.1.0 .                                        # the operator (the chart's image)
#   docker build --target worker -t phalanx-worker:0.1.0-pypi \
#     --build-arg TORCH_VARIANT=pypi .                                     # worker, PyPI's torch (CUDA)
#   phalanx image lock --torch-variant cpu --torch-index-url <PyTorch's CPU wheel index>   # once: its lock
#   docker build --target worker -t phalanx-worker:0.1.0 \
#     --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> .            # worker (examples/), CPU torch
#   docker build --target worker -t phalanx-worker:0.1.0-cu126 --build-arg TORCH_VARIANT=cu126 \
#     --build-arg TORCH_INDEX_URL=<PyTorch's cu126 wheel index> .          # worker, CUDA torch (its lock first)
# PyTorch's wheel index for a variant is the `--index-url` its install selector prints for pip.
#
# Without a registry (no base image to pull): `phalanx image build` (or `make image`) builds the bases from the
# machine's Debian mirror and passes them as BASE_IMAGE (docs/images.md). Its worker is CPU-only with Debian's
# own torch (TORCH_VARIANT=debian: the base holds `python3-torch`, the venv sees it), since PyPI serves torch
# for Linux only as its CUDA build; a local wheel folder (WHEELS) can serve PyTorch's CPU wheel instead.
#
# Every Python distribution is installed from a hash lock (locks/, written by `phalanx image lock` from
# constraints.txt, the versions the tests run with) with `pip install --require-hashes --no-deps`: an index can
# serve nothing but the files the lock names. Each install is then checked against the image's requirements
# with no index at all (`--no-index --dry-run`), so a lock that misses a dependency stops the build.
# torch and its accelerator stack come from the variant's own lock, locks/torch-<TORCH_VARIANT>.txt: `pypi` is
# PyPI's torch (its CUDA build); a variant of PyTorch's index (cpu, cu126, ...) needs its lock written first:
#   phalanx image lock --torch-variant cpu --torch-index-url <PyTorch's CPU wheel index>
# `debian` is the base's own python3-torch (Debian's archive signs it), and the locks lose what the base has.
#
# The base is pinned by digest: python:3.11-slim-bookworm as docker-library's repo-info records it for Python
# 3.11.16 (built 2026-08-25). To move it: `docker buildx imagetools inspect python:3.11-slim-bookworm`.
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:fe556eaffd0d96abd8685b83bb8a69addd0dc730fa193669a7df0d49ddcfac02

# The user and the virtualenv both images run from. Each image is its dependencies' stage plus one small layer
# of Phalanx itself, so a change in Phalanx's code rebuilds only that layer (no copy of the large venv).
FROM ${BASE_IMAGE} AS runtime
# cpu, pypi, debian (the base's own python3-torch) or a CUDA variant of PyTorch's wheels (cu126, cu128, ...).
ARG TORCH_VARIANT=cpu
RUN groupadd --system --gid 10001 phalanx \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY locks/bootstrap.txt /tmp/bootstrap.txt
# With Debian's torch the venv sees the base's packages: torch and what it was built against.
RUN python -m venv $([ "$TORCH_VARIANT" = debian ] && echo --system-site-packages) /opt/phalanx \
 && /opt/phalanx/bin/pip install --require-hashes --no-deps --only-binary :all: -r /tmp/bootstrap.txt \
 && rm /tmp/bootstrap.txt
ENV PATH=/opt/phalanx/bin:$PATH
LABEL org.opencontainers.image.title="phalanx" \
      org.opencontainers.image.licenses="Apache-2.0"

# The requirements of the core and each image's extras, from pyproject.toml alone, and the locks; each image's
# stage then takes from its lock what the base does not already provide (src/phalanx/images/requirements.py).
FROM runtime AS requirements
WORKDIR /src
COPY pyproject.toml src/phalanx/images/requirements.py ./
COPY locks ./locks
RUN python requirements.py /requirements

FROM runtime AS operator-deps
COPY --from=requirements /requirements /tmp/requirements
RUN python /tmp/requirements/requirements.py --for operator /tmp/requirements \
 && pip install --require-hashes --no-deps --only-binary :all: -r /tmp/requirements/operator.lock \
 && pip install --no-index --dry-run --quiet -r /tmp/requirements/operator.in \
 && rm -rf /tmp/requirements

FROM runtime AS worker-deps
ARG TORCH_VARIANT=cpu
# An index that holds the variant's torch (none by default: no index host is assumed).
ARG TORCH_INDEX_URL=
# A folder of wheels mounted into the build (`buildah bud -v DIR:/wheels:ro --build-arg WHEELS=/wheels`).
ARG WHEELS=
COPY --from=requirements /requirements /tmp/requirements
RUN if [ "$TORCH_VARIANT" = debian ]; then \
      python -c 'import torch' \
      || { echo "TORCH_VARIANT=debian needs a base image with Debian's python3-torch" >&2; exit 1; }; \
    else lock="/tmp/requirements/locks/torch-${TORCH_VARIANT}.txt"; \
      [ -f "$lock" ] || { echo "no lock of torch variant ${TORCH_VARIANT} in locks/: write it with" \
        "phalanx image lock --torch-variant ${TORCH_VARIANT} --torch-index-url <its index>" >&2; exit 1; }; \
      pip install --require-hashes --no-deps --only-binary :all: ${WHEELS:+--find-links "$WHEELS"} \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r "$lock"; \
    fi \
 && python /tmp/requirements/requirements.py --for worker /tmp/requirements \
 && pip install --require-hashes --no-deps --only-binary :all: -r /tmp/requirements/worker.lock \
 && pip install --no-index --dry-run --quiet -r /tmp/requirements/worker.in \
 && case "$TORCH_VARIANT" in cu*|pypi) ;; *) if pip list --format=freeze | grep -iE '^nvidia-'; then \
      echo "CUDA packages (above) in a CPU image" >&2; exit 1; fi ;; esac \
 && rm -rf /tmp/requirements

# Phalanx itself as a wheel: the only stage a change in its code re-runs, with the small layers below.
FROM runtime AS phalanx-wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY operator ./operator
COPY worker ./worker
COPY devcluster ./devcluster
COPY bench ./bench
COPY crds ./crds
COPY charts ./charts
COPY examples ./examples
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheel .

FROM worker-deps AS worker
COPY --from=phalanx-wheel /wheel /tmp/wheel
RUN pip install --no-deps /tmp/wheel/*.whl && rm -rf /tmp/wheel \
 && python -c "import phalanx.worker.launch, importlib.util as u; assert u.find_spec('kopf') is None" \
 && python -c "import torch, phalanx.worker.torch_support as s; s.require_supported(torch.__version__)"
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /tmp
USER 10001:10001
LABEL org.opencontainers.image.description="Phalanx PyTorch worker (launcher and training runtime)"
# Pods name their command; this default only makes `docker run IMAGE` print the launcher's help.
CMD ["python", "-m", "phalanx.worker.launch", "--help"]

# Last stage: the default target is the operator.
FROM operator-deps AS operator
COPY --from=phalanx-wheel /wheel /tmp/wheel
RUN pip install --no-deps /tmp/wheel/*.whl && rm -rf /tmp/wheel \
 && python -c "import phalanx.operator.main, importlib.util as u; assert u.find_spec('torch') is None" \
 && phalanx crd > /dev/null
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /tmp
USER 10001:10001
LABEL org.opencontainers.image.description="Phalanx TrainingJob operator"
EXPOSE 8080 8081
CMD ["phalanx", "operator", "run"]

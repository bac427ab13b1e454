# Two images from one Dockerfile: the operator (extra `operator`: kopf, no torch) and the worker (extras
# `worker` and `s3`: torch, no kopf). The default target is the operator.
#
# With a container registry and a Python package index at hand:
#   docker build -t phalanx:0.1.0 .                                        # the operator (the chart's image)
#   docker build --target worker -t phalanx-worker:0.1.0 \
#     --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> .            # worker (examples/), CPU torch
#   docker build --target worker -t phalanx-worker:0.1.0-cu126 --build-arg TORCH_VARIANT=cu126 \
#     --build-arg TORCH_INDEX_URL=<PyTorch's cu126 wheel index> .          # worker, CUDA torch (wheels bundle CUDA)
# PyTorch's wheel index for a variant is the `--index-url` its install selector prints for pip.
#
# Without a registry (no base image to pull): `phalanx image build` (or `make image`) builds the base from the
# machine's Debian mirror, passes it as BASE_IMAGE and serves a local wheel folder as WHEELS (docs/images.md).
#
# torch is deterministic: pip is told `torch==<constraints.txt's version>+<TORCH_VARIANT>` exactly, so it can
# never swap the CPU build for the CUDA one (or back); without a source of that wheel the build fails, and it
# checks the torch it got. Every other dependency is pinned by constraints.txt, the versions the tests run with.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# The user and the virtualenv both images run from. Each image is its dependencies' stage plus one small layer
# of Phalanx itself, so a change in Phalanx's code rebuilds only that layer (no copy of the large venv).
FROM ${BASE_IMAGE} AS runtime
RUN groupadd --system --gid 10001 phalanx \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/phalanx \
 && /opt/phalanx/bin/pip install --upgrade pip setuptools wheel
ENV PATH=/opt/phalanx/bin:$PATH
LABEL org.opencontainers.image.title="phalanx" \
      org.opencontainers.image.licenses="Apache-2.0"

# The requirements of the core and the named extras, from pyproject.toml alone, and the pins of constraints.txt
# less the accelerator stack (torch, triton, nvidia-*, cuda-*), which comes with the torch variant.
FROM runtime AS requirements
WORKDIR /src
COPY pyproject.toml constraints.txt ./
RUN printf '%s\n' \
      'import sys, tomllib' \
      'project = tomllib.load(open("pyproject.toml", "rb"))["project"]' \
      'extras = project["optional-dependencies"]' \
      'print("\n".join(project["dependencies"] + [r for name in sys.argv[1:] for r in extras[name]]))' \
      > requirements.py \
 && mkdir /requirements \
 && python requirements.py operator > /requirements/operator.txt \
 && python requirements.py worker s3 > /requirements/worker.txt \
 && grep -viE '^(torch|triton|nvidia-|cuda-)' constraints.txt > /requirements/constraints.txt \
 && sed -n 's/^torch==\([^+]*\).*/\1/p' constraints.txt > /requirements/torch-version

FROM runtime AS operator-deps
COPY --from=requirements /requirements /tmp/requirements
RUN pip install -c /tmp/requirements/constraints.txt -r /tmp/requirements/operator.txt \
 && rm -rf /tmp/requirements

FROM runtime AS worker-deps
# cpu, or a CUDA variant of PyTorch's wheels (cu126, cu128, ...).
ARG TORCH_VARIANT=cpu
# An index that holds torch==<version>+<TORCH_VARIANT> (none by default: no index host is assumed).
ARG TORCH_INDEX_URL=
# A folder of wheels mounted into the build (`buildah bud -v DIR:/wheels:ro --build-arg WHEELS=/wheels`).
ARG WHEELS=
COPY --from=requirements /requirements /tmp/requirements
RUN torch="$(cat /tmp/requirements/torch-version)+${TORCH_VARIANT}" \
 && echo "torch==${torch}" > /tmp/requirements/torch.txt \
 && pip install -c /tmp/requirements/constraints.txt -c /tmp/requirements/torch.txt \
      ${WHEELS:+--find-links "$WHEELS"} ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      -r /tmp/requirements/worker.txt \
 && got="$(python -c 'import torch; print(torch.__version__)')" \
 && { [ "$got" = "$torch" ] || { echo "torch $got installed, $torch asked for" >&2; exit 1; }; } \
 && if [ "$TORCH_VARIANT" = cpu ] && pip list --format=freeze | grep -iE '^nvidia-'; then \
      echo "CUDA packages (above) in a CPU image" >&2; exit 1; fi \
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
 && python -c "import phalanx.worker.launch, importlib.util as u; assert u.find_spec('kopf') is None"
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

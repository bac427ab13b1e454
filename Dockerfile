# Two images from one Dockerfile: the operator (extra `operator`: kopf, no torch) and the worker (extras
# `worker` and `s3`: torch, no kopf). The default target is the operator.
#
#   docker build -t phalanx:0.1.0 .                                            # the operator (the chart's image)
#   docker build --target worker -t phalanx-worker:0.1.0 .                     # worker (examples/), CPU torch
#   docker build --target worker -t phalanx-worker:0.1.0-cu124 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .     # worker, CUDA torch (wheels bundle CUDA)
#
# Both install from the same pyproject.toml the tests use (`pip install .`), so the images run what CI tested.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS base-build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/phalanx
ENV PATH=/opt/phalanx/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
# The requirements of the core and the named extras, from pyproject.toml alone: installed before the code is
# copied, so that layer stays cached while only the code changes.
RUN pip install --upgrade pip setuptools wheel \
 && printf '%s\n' \
      'import sys, tomllib' \
      'project = tomllib.load(open("pyproject.toml", "rb"))["project"]' \
      'extras = project["optional-dependencies"]' \
      'print("\n".join(project["dependencies"] + [r for name in sys.argv[1:] for r in extras[name]]))' \
      > /tmp/requirements.py

FROM base-build AS operator-build
RUN python /tmp/requirements.py operator > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY src ./src
COPY operator ./operator
COPY worker ./worker
COPY devcluster ./devcluster
COPY bench ./bench
COPY crds ./crds
COPY charts ./charts
COPY examples ./examples
RUN pip install --no-deps . \
 && python -c "import phalanx.operator.main, importlib.util as u; assert u.find_spec('torch') is None" \
 && phalanx crd > /dev/null

FROM base-build AS worker-build
# Where torch comes from: the CPU wheels by default; a CUDA index (cu121, cu124, ...) for GPU images.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python /tmp/requirements.py worker s3 > /tmp/requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/requirements.txt
COPY src ./src
COPY operator ./operator
COPY worker ./worker
COPY devcluster ./devcluster
COPY bench ./bench
COPY crds ./crds
COPY charts ./charts
COPY examples ./examples
RUN pip install --no-deps . \
 && python -c "import phalanx.worker.launch, importlib.util as u; assert u.find_spec('kopf') is None"

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 phalanx \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx
ENV PATH=/opt/phalanx/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /tmp
LABEL org.opencontainers.image.title="phalanx" \
      org.opencontainers.image.licenses="Apache-2.0"

FROM runtime AS worker
COPY --from=worker-build /opt/phalanx /opt/phalanx
USER 10001:10001
LABEL org.opencontainers.image.description="Phalanx PyTorch worker (launcher and training runtime)"
# Pods name their command; this default only makes `docker run IMAGE` print the launcher's help.
CMD ["python", "-m", "phalanx.worker.launch", "--help"]

# Last stage: the default target is the operator.
FROM runtime AS operator
COPY --from=operator-build /opt/phalanx /opt/phalanx
USER 10001:10001
LABEL org.opencontainers.image.description="Phalanx TrainingJob operator"
EXPOSE 8080 8081
CMD ["phalanx", "operator", "run"]

# One image for the operator and the workers (targets `operator` and `worker` only change the default command).
#
#   docker build -t phalanx:0.1.0 .                                   # CPU torch
#   docker build -t phalanx:0.1.0-cu124 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .   # CUDA torch (wheels bundle CUDA)
#
# It installs from the same pyproject.toml the tests use (`pip install .`), so the image runs what CI tested.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
# Where torch comes from: the CPU wheels by default; a CUDA index (cu121, cu124, ...) for GPU images.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/phalanx
ENV PATH=/opt/phalanx/bin:$PATH
WORKDIR /src
# Dependencies first (cached while only the code changes): resolve them from pyproject.toml alone, with the
# `s3` extra so checkpoints can go to object storage.
COPY pyproject.toml README.md ./
RUN pip install --upgrade pip setuptools wheel \
 && python -c "import tomllib; p = tomllib.load(open('pyproject.toml','rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['s3']))" \
      > /tmp/requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/requirements.txt
COPY src ./src
COPY operator ./operator
COPY worker ./worker
COPY devcluster ./devcluster
COPY bench ./bench
# src/phalanx/{operator,worker,devcluster,bench} are development symlinks; pyproject maps those packages itself.
RUN find src -type l -delete \
 && pip install --no-deps . \
 && python -c "import phalanx.operator.api, phalanx.worker" \
 && phalanx crd > /dev/null

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 phalanx \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx
COPY --from=build /opt/phalanx /opt/phalanx
ENV PATH=/opt/phalanx/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
WORKDIR /tmp
USER 10001:10001
LABEL org.opencontainers.image.title="phalanx" \
      org.opencontainers.image.description="Phalanx TrainingJob operator and PyTorch worker" \
      org.opencontainers.image.licenses="Apache-2.0"

FROM runtime AS worker
# Pods name their command; this default only makes `docker run IMAGE` print the launcher's help.
CMD ["python", "-m", "phalanx.worker.launch", "--help"]

# Last stage: the default target is the operator.
FROM runtime AS operator
EXPOSE 8080 8081
CMD ["phalanx", "operator", "run"]

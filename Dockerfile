# Benchmark image: CUDA runtime + Python 3.11 + the locked environment; runs the workflow.
#   docker build --build-arg GIT_REVISION=$(git rev-parse HEAD) -t frcnn-dp-bench .
#   docker run --gpus all --ipc=host -v "$PWD/results:/workspace/results" frcnn-dp-bench
# torch's wheels bring their own CUDA 13 libraries; the base image supplies the user-space
# driver hooks the NVIDIA container runtime expects.
# Any Debian/Ubuntu base works (CUDA_IMAGE build argument): benchmarks/container_check.sh builds
# this file unchanged on a local Debian 12 base with podman and runs the workflow in it.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Python 3.11, the version the lock was compiled for: the base image's own python3.11 if it has
# one; else the distribution's (Debian 12, Ubuntu 22.04); else (Ubuntu 24.04, the default CUDA
# base, whose archive has only 3.12) the deadsnakes PPA, which needs Launchpad. git for
# provenance (the revision recorded with every result) and for DVC.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && if python3.11 -c "import ensurepip, venv" 2>/dev/null; then \
           echo "python3.11 from the base image"; \
       elif apt-cache show python3.11-venv >/dev/null 2>&1; then \
           apt-get install -y --no-install-recommends python3.11 python3.11-venv; \
       else \
           apt-get install -y --no-install-recommends software-properties-common gpg-agent \
           && add-apt-repository -y ppa:deadsnakes/ppa \
           && apt-get update \
           && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
           || { echo "No python3.11 in the base image or its archive, and the deadsnakes PPA" \
                     "(Launchpad) failed: build on a base that has it, e.g." \
                     "--build-arg CUDA_IMAGE=<a Debian 12 or Ubuntu 22.04 based image> (README, Container)" >&2; \
                exit 1; }; \
       fi \
    && rm -rf /var/lib/apt/lists/*

# The LaTeX toolchain that compiles the paper (rule paper), from the list the README uses.
COPY apt/paper.txt /tmp/apt-paper.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && xargs -a /tmp/apt-paper.txt apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/apt-paper.txt

# The package index and CA bundle pip uses, for builds behind a mirror or a TLS proxy
# (e.g. --build-arg PIP_INDEX_URL=https://mirror.example/simple); unset, pip uses PyPI. They are
# build arguments only: nothing of them stays in the image's environment.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_CERT
COPY requirements.lock /tmp/requirements.lock
RUN python3.11 -m venv "$VIRTUAL_ENV" \
    && pip install --no-cache-dir -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock

# The user the workflow runs as. Ubuntu 24.04 images already have uid and gid 1000 (ubuntu):
# an existing user or group with these ids is reused, otherwise "bench" is created.
ARG BENCH_UID=1000
ARG BENCH_GID=1000
RUN (getent group "$BENCH_GID" >/dev/null || groupadd --gid "$BENCH_GID" bench) \
    && (getent passwd "$BENCH_UID" >/dev/null \
        || useradd --create-home --no-log-init --uid "$BENCH_UID" --gid "$BENCH_GID" bench) \
    && mkdir -p /workspace/results /workspace/logs \
    && chown -R "$BENCH_UID:$BENCH_GID" /workspace
WORKDIR /workspace
COPY --chown=${BENCH_UID}:${BENCH_GID} . /workspace
USER ${BENCH_UID}:${BENCH_GID}

# .git stays out of the build context: the revision is recorded with every result from here.
ARG GIT_REVISION=unknown
ENV BENCH_GIT_REVISION=${GIT_REVISION}

# Torch hub caches (pretrained backbone weights) go where a volume can keep them.
ENV TORCH_HOME=/workspace/.cache/torch

CMD ["snakemake", "--cores", "all"]

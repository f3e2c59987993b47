# Benchmark image: CUDA runtime + Python 3.11 + the locked environment; runs the workflow.
#   docker build --build-arg GIT_REVISION=$(git rev-parse HEAD) -t frcnn-dp-bench .
#   docker run --gpus all --ipc=host -v "$PWD/results:/workspace/results" frcnn-dp-bench
# torch's wheels bring their own CUDA 13 libraries; the base image supplies the user-space
# driver hooks the NVIDIA container runtime expects.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Python 3.11 (the version the lock was compiled for) from the deadsnakes archive; git for
# provenance (the revision recorded with every result) and for DVC.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# The LaTeX toolchain that compiles the paper (rule paper), from the list the README uses.
COPY apt/paper.txt /tmp/apt-paper.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && xargs -a /tmp/apt-paper.txt apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/apt-paper.txt

COPY requirements.lock /tmp/requirements.lock
RUN python3.11 -m venv "$VIRTUAL_ENV" \
    && pip install --no-cache-dir -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock

RUN useradd --create-home --uid 1000 bench \
    && mkdir -p /workspace/results \
    && chown -R bench:bench /workspace
WORKDIR /workspace
COPY --chown=bench:bench . /workspace
USER 1000:1000

# .git stays out of the build context: the revision is recorded with every result from here.
ARG GIT_REVISION=unknown
ENV BENCH_GIT_REVISION=${GIT_REVISION}

# Torch hub caches (pretrained backbone weights) go where a volume can keep them.
ENV TORCH_HOME=/workspace/.cache/torch

CMD ["snakemake", "--cores", "all"]

# syntax=docker/dockerfile:1
# FlowServe image: one image for the gateway and the executors (the command picks which).
#
#   docker build -t flowserve:0.1.0 .                                   # no torch
#   docker build -t flowserve:0.1.0-torch --build-arg TORCH_VERSION=2.13.0 .   # + CPU torch
#
#   docker run --rm flowserve:0.1.0 python -m executors.worker.executor --id e0 \
#       --address tcp://0.0.0.0:5555 --kvs redis://:PASSWORD@redis:6379/0
#   docker run --rm -p 8000:8000 -e FLOWSERVE_ADMIN_TOKEN=... flowserve:0.1.0 python -m k8s.gateway \
#       --address tcp://0.0.0.0:5556 --kvs redis://:PASSWORD@redis:6379/0
#
# The Kubernetes manifests (`flowserve k8s render`) set the command per component and run
# the container as the non-root user below with a read-only root filesystem.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: install the project and its dependencies into a virtual environment ----------
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=""
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG EXTRAS=k8s
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/flowserve
ENV PATH=/opt/flowserve/bin:$PATH
# CPU-only torch from its own index first (a bare `pip install torch` pulls a multi-GB CUDA
# build); empty TORCH_VERSION: no torch.
RUN if [ -n "$TORCH_VERSION" ]; then \
        pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"; \
    fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY flowserve ./flowserve
COPY flow ./flow
COPY optimizer ./optimizer
COPY executors ./executors
COPY kvs ./kvs
COPY k8s ./k8s
RUN pip install --no-cache-dir ".[${EXTRAS}]" \
    && python -m compileall -q /opt/flowserve

# ---- runtime: the environment only, as a non-root user -------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="flowserve" \
      org.opencontainers.image.description="Serve ML prediction pipelines as optimized dataflows" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 flowserve \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/flowserve --create-home \
       --shell /usr/sbin/nologin flowserve \
    && mkdir -p /var/cache/flowserve \
    && chown 10001:10001 /var/cache/flowserve
COPY --from=build /opt/flowserve /opt/flowserve
ENV PATH=/opt/flowserve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLOWSERVE_ARTIFACT_CACHE=/var/cache/flowserve
WORKDIR /home/flowserve
USER 10001:10001
# 8000 gateway HTTP, 5556 gateway results, 5555 executor messages (framed TCP, executors/wire/transport.py)
EXPOSE 8000 5555 5556
CMD ["flowserve", "--help"]

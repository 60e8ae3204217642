# syntax=docker/dockerfile:1
# Worker (runtime) image: torch with CUDA and NCCL >= 2.25.2 (MNNVL on GB200), pynvml and the
# in-pod part of mnnvl (mnnvl.runtime and the few modules it imports). No kfp, hera or
# Kubernetes client: workers never talk to the API server.
#   make images REGISTRY=ghcr.io/you TAG=0.1.0      (or docker build -f images/runtime.Dockerfile .)
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch
ARG BASE_TAG=25.10-py3
ARG BASE_DIGEST=
FROM ${BASE_IMAGE}:${BASE_TAG}${BASE_DIGEST:+@${BASE_DIGEST}}

ARG BASE_IMAGE
ARG BASE_TAG
ARG BASE_DIGEST
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="mnnvl-pipelines runtime" \
      org.opencontainers.image.description="Worker image: sharded training and NVLink verification for multi-node NVLink" \
      org.opencontainers.image.source="https://github.com/mnnvl-pipelines/mnnvl-pipelines" \
      org.opencontainers.image.url="https://github.com/mnnvl-pipelines/mnnvl-pipelines" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}:${BASE_TAG}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

# Ubuntu 24.04 bases (NGC PyTorch 24.x and later) already have uid 1000 (`ubuntu`): use it.
RUN pip install --no-cache-dir "nvidia-ml-py>=12.560" "matplotlib>=3.8" \
    && (getent passwd 1000 >/dev/null \
        || useradd --uid 1000 --create-home --shell /usr/sbin/nologin mnnvl) \
    && mkdir -p /workspace && chown 1000:1000 /workspace

# Only what the workers import (tests/unit/test_images.py checks this list imports alone).
COPY mnnvl/__init__.py mnnvl/errors.py mnnvl/ports.py mnnvl/units.py mnnvl/report.py \
     mnnvl/report_doc.py mnnvl/ctrf.py \
     /opt/mnnvl/mnnvl/
COPY mnnvl/inputs /opt/mnnvl/mnnvl/inputs
COPY mnnvl/contract /opt/mnnvl/mnnvl/contract
COPY mnnvl/runtime /opt/mnnvl/mnnvl/runtime
ENV PYTHONPATH=/opt/mnnvl \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib

USER 1000:1000
WORKDIR /workspace

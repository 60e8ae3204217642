# syntax=docker/dockerfile:1
# Launcher (component) image: runs the KFP components and `mnnvl <step>` for Argo. It creates
# the workers through the Kubernetes API and writes the reports (matplotlib draws their plots);
# it needs neither torch nor GPUs.
#   make images REGISTRY=ghcr.io/you TAG=0.1.0      (or docker build -f images/launcher.Dockerfile .)
# Pin the base by digest for a reproducible build: BASE_DIGEST=sha256:… (`make images` resolves
# the tag's current digest when empty and records it in the image's labels).
ARG BASE_IMAGE=docker.io/library/python
ARG BASE_TAG=3.12-slim
ARG BASE_DIGEST=
FROM ${BASE_IMAGE}:${BASE_TAG}${BASE_DIGEST:+@${BASE_DIGEST}}

ARG BASE_IMAGE
ARG BASE_TAG
ARG BASE_DIGEST
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="mnnvl-pipelines launcher" \
      org.opencontainers.image.description="Kubeflow Pipelines / Argo launcher for multi-node NVLink training on Kubernetes" \
      org.opencontainers.image.source="https://github.com/mnnvl-pipelines/mnnvl-pipelines" \
      org.opencontainers.image.url="https://github.com/mnnvl-pipelines/mnnvl-pipelines" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}:${BASE_TAG}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

# matplotlib's cache must be writable with a read-only root file system (/tmp is a volume).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /src
COPY pyproject.toml README.md ./
COPY mnnvl ./mnnvl
COPY components ./components
COPY pipelines ./pipelines
RUN pip install --no-cache-dir ".[kfp,argo,report]" && rm -rf /src

USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["mnnvl"]

# Worker (runtime) image: torch with CUDA and NCCL >= 2.25.2 (MNNVL on GB200), pynvml, mnnvl.runtime.
# Needs neither kfp nor hera.
# docker build -f images/runtime.Dockerfile -t ghcr.io/mnnvl-pipelines/runtime:0.1.0 .
FROM nvcr.io/nvidia/pytorch:25.10-py3
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mnnvl ./mnnvl
COPY components ./components
COPY pipelines ./pipelines
RUN pip install --no-cache-dir --no-deps . && pip install --no-cache-dir "nvidia-ml-py>=12.560" pyyaml matplotlib && rm -rf /src
WORKDIR /workspace

# Launcher (component) image: runs the KFP components and `mnnvl <step>` for Argo.
# Needs the Kubernetes client and kfp/hera, not torch.
# docker build -f images/launcher.Dockerfile -t ghcr.io/mnnvl-pipelines/launcher:0.1.0 .
FROM python:3.12-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mnnvl ./mnnvl
COPY components ./components
COPY pipelines ./pipelines
RUN pip install --no-cache-dir ".[kfp,argo]" && rm -rf /src
USER 65532:65532
ENTRYPOINT ["mnnvl"]

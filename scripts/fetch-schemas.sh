#!/usr/bin/env bash
# Fetch the upstream schemas the tests validate against, in the layout MNNVL_SCHEMA_DIR expects:
#   <dir>/nvidia-dra-driver/crds/               ComputeDomain CRDs, NVIDIA DRA driver v25.12.0
#   <dir>/nvidia-dra-driver/v0.4.0/crds/        the same CRDs at v0.4.0 (kubernetes-sigs line)
#   <dir>/argo-workflows/schema.json            Argo Workflows JSON schema, v4.1.2
#   <dir>/argo-workflows/schema-v4.0.10.json    Argo Workflows JSON schema, v4.0.10
#   <dir>/kubeflow-trainer/crds/                the TrainJob CRD, Kubeflow Trainer v2.4.0
#                                               (spec.trainer.resourceClaimsPerNode)
# Usage: scripts/fetch-schemas.sh [dir]   then   export MNNVL_SCHEMA_DIR=<dir>
set -euo pipefail
dir="${1:-schemas}"
gh="https://raw.githubusercontent.com"
# Download into a scratch directory and move it into place only when every file arrived:
# a failed fetch (offline, proxy) leaves no empty or half-filled schemas/ behind.
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
fetch() {
  local to="$staging/${2#"$dir"/}"
  mkdir -p "$(dirname "$to")"; echo "fetch $1"
  curl -fsSL --retry 3 -o "$to" "$1" || {
    echo "scripts/fetch-schemas.sh: cannot download $1 (offline, or a proxy in the way)." \
      "Run scripts/fetch-schemas.sh DIR where the network is, copy DIR here and give it as" \
      "MNNVL_SCHEMA_DIR (make test MNNVL_SCHEMA_DIR=DIR)." >&2
    exit 1
  }
}

for crd in computedomains computedomaincliques; do
  fetch "$gh/NVIDIA/k8s-dra-driver-gpu/v25.12.0/deployments/helm/nvidia-dra-driver-gpu/crds/resource.nvidia.com_${crd}.yaml" \
        "$dir/nvidia-dra-driver/crds/resource.nvidia.com_${crd}.yaml"
  fetch "$gh/kubernetes-sigs/dra-driver-nvidia-gpu/v0.4.0/deployments/helm/dra-driver-nvidia-gpu/crds/resource.nvidia.com_${crd}.yaml" \
        "$dir/nvidia-dra-driver/v0.4.0/crds/resource.nvidia.com_${crd}.yaml"
done
fetch "$gh/argoproj/argo-workflows/v4.1.2/api/jsonschema/schema.json" "$dir/argo-workflows/schema.json"
fetch "$gh/argoproj/argo-workflows/v4.0.10/api/jsonschema/schema.json" "$dir/argo-workflows/schema-v4.0.10.json"
fetch "$gh/kubeflow/trainer/v2.4.0/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml" \
      "$dir/kubeflow-trainer/crds/trainer.kubeflow.org_trainjobs.yaml"
mkdir -p "$dir" && cp -R "$staging"/. "$dir"/
echo "done: export MNNVL_SCHEMA_DIR=$(cd "$dir" && pwd)"

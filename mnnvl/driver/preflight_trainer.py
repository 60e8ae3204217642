"""Preflight rows of the TrainJob workload: Trainer's API, the runtime, the claim field.

``trainjob-api`` lists TrainJobs in the namespace (what ``manifests/overlays/trainer`` grants),
so it tells a missing Trainer (404, or 403 and no ``trainer.kubeflow.org`` in discovery)
from a missing grant (403). ``trainjob-runtime`` reads the
ClusterTrainingRuntime the TrainJobs name: its ``node`` replicated job, the torch policy and
how often its JobSet ``failurePolicy`` restarts. ``trainjob-claims-field`` reads the TrainJob
CRD (the cluster reader grants that) for ``spec.trainer.resourceClaimsPerNode`` (Trainer
v2.4.0): without it the API server drops or refuses the channel claim.
"""

from __future__ import annotations

from typing import Any

from mnnvl.contract.result import FAIL, PASS
from mnnvl.driver.api import Api, Kind
from mnnvl.driver.preflight import CRD, NOT_READABLE, SKIPPED, WARN, Row
from mnnvl.driver.trainjob import TRAINJOB
from mnnvl.errors import NotFound, Refused

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
CLUSTER_RUNTIME = Kind("ClusterTrainingRuntime", GROUP, VERSION, "clustertrainingruntimes")
TRAINJOB_CRD = f"trainjobs.{GROUP}"
OVERLAY = "manifests/overlays/trainer"
INSTALL = (
    "install Kubeflow Trainer v2.4.0 or later (its Helm chart, or kubectl apply --server-side "
    "-k 'https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.4.0')"
)
GATE = (
    "upgrade Kubeflow Trainer to v2.4.0 or later and turn on its DynamicResourceAllocation "
    "feature gate (Kubernetes >= 1.34)"
)


def trainer_rows(api: Api, namespace: str, runtime: str, max_restarts: int) -> list[Row]:
    """The three rows, in the order a TrainJob run needs them."""
    return [
        api_row(api, namespace),
        runtime_row(api, runtime, max_restarts),
        claims_field_row(api),
    ]


def api_row(api: Api, namespace: str) -> Row:
    try:
        api.list(TRAINJOB, namespace)
    except NotFound:
        return Row("trainjob-api", FAIL, f"{TRAINJOB_CRD}/{VERSION} not served", INSTALL)
    except Refused:  # a 403 comes before the lookup: discovery tells which it is
        if not api.served(GROUP, VERSION):
            return Row("trainjob-api", FAIL, f"{TRAINJOB_CRD}/{VERSION} not served", INSTALL)
        text = f"the runner may not list TrainJobs in {namespace}"
        return Row("trainjob-api", FAIL, text, f"kubectl apply -n {namespace} -k {OVERLAY}")
    return Row("trainjob-api", PASS, f"{TRAINJOB_CRD}/{VERSION} served; the runner may use it")


def runtime_row(api: Api, runtime: str, max_restarts: int) -> Row:
    check = "trainjob-runtime"
    try:
        found = api.get(CLUSTER_RUNTIME, "", runtime)
    except NotFound:
        fix = (
            f"install ClusterTrainingRuntime {runtime} (Trainer's Helm chart installs "
            "torch-distributed) or name another with --trainjob-runtime"
        )
        return Row(check, FAIL, f"ClusterTrainingRuntime {runtime} not found", fix)
    except Refused:
        if not api.served(GROUP, VERSION):
            text = f"ClusterTrainingRuntime {runtime}: Trainer not served"
            return Row(check, FAIL, text, INSTALL)
        text = f"ClusterTrainingRuntime {runtime} not readable by this account; {OVERLAY} grants it"
        return Row(check, SKIPPED, text)
    return runtime_verdict(found, max_restarts)


def runtime_verdict(runtime: dict[str, Any], max_restarts: int) -> Row:
    """A torch runtime with a ``node`` replicated job, restarting as often as asked."""
    name = runtime["metadata"]["name"]
    spec = runtime.get("spec") or {}
    jobs = [
        j.get("name")
        for j in (spec.get("template") or {}).get("spec", {}).get("replicatedJobs") or []
    ]
    torch = "torch" in (spec.get("mlPolicy") or {})
    policy = (spec.get("template") or {}).get("spec", {}).get("failurePolicy") or {}
    restarts = int(policy.get("maxRestarts", 0))
    text = (
        f"{name}: replicated jobs {', '.join(map(str, jobs)) or 'none'}, "
        f"{'torch' if torch else 'no torch'} policy, JobSet maxRestarts {restarts}"
    )
    if "node" not in jobs or not torch:
        fix = "name a torch runtime with a replicated job 'node' (torch-distributed has one)"
        return Row("trainjob-runtime", FAIL, text, fix)
    if restarts < max_restarts:
        fix = (
            f"a failed pod ends the TrainJob after {restarts} restart(s), not --max-restarts "
            f"{max_restarts}: set spec.template.spec.failurePolicy.maxRestarts in the runtime"
        )
        return Row("trainjob-runtime", WARN, text, fix)
    return Row("trainjob-runtime", PASS, text)


def claims_field_row(api: Api) -> Row:
    check = "trainjob-claims-field"
    try:
        crd = api.get(CRD, "", TRAINJOB_CRD)
    except NotFound:
        return Row(check, FAIL, f"CRD {TRAINJOB_CRD} not installed", INSTALL)
    except Refused:
        return Row(check, SKIPPED, f"CRD {TRAINJOB_CRD} {NOT_READABLE}")
    if has_claims_per_node(crd):
        text = (
            "spec.trainer.resourceClaimsPerNode served (Trainer >= v2.4.0); where the "
            "DynamicResourceAllocation gate is off, Trainer refuses the first TrainJob"
        )
        return Row(check, PASS, text)
    return Row(check, FAIL, "no spec.trainer.resourceClaimsPerNode in the TrainJob CRD", GATE)


def has_claims_per_node(crd: dict[str, Any]) -> bool:
    """Whether a served TrainJob CRD has ``spec.trainer.resourceClaimsPerNode``."""
    for version in (crd.get("spec") or {}).get("versions") or []:
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        spec = (schema.get("properties") or {}).get("spec") or {}
        trainer = (spec.get("properties") or {}).get("trainer") or {}
        if "resourceClaimsPerNode" in (trainer.get("properties") or {}):
            return True
    return False

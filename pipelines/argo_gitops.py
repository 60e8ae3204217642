"""Argo objects for GitOps: hardened templates, a verify-only WorkflowTemplate, CronWorkflows.

Every WorkflowTemplate this project ships goes through :func:`harden`: launcher pods run as
non-root with a read-only root file system (``/tmp`` is an ``emptyDir``: the result file and
matplotlib's cache live there), no privilege escalation and no capabilities; each step template
declares its volume and pod security context itself, so ``templateRef`` works; finished
workflows are deleted after a while (``ttlStrategy``) and succeeded pods at once (``podGC``;
failed ones stay for ``kubectl logs``); a retry happens only for exit codes a retry can fix
(never 2, bad input or a conflict, nor 4, a failed workload or verdict).

The CronWorkflows reference WorkflowTemplates by name and name no namespace: kustomize (or
``kubectl apply -n``) places them, and ``{{workflow.namespace}}`` is where they run.
"""

from __future__ import annotations

import copy
from typing import Any

from mnnvl.components import argo_templates as t
from mnnvl.pipelines import argo_workflow as aw
from mnnvl.spec import DEFAULT_LAUNCHER_IMAGE

API_VERSION = "argoproj.io/v1alpha1"
VERIFY_ONLY_NAME = "mnnvl-verify-only"
FABRIC_CHECK_NAME = "mnnvl-nightly-fabric-check"
REAP_NAME = "mnnvl-reap"
LAUNCHER_UID = 65532  # the launcher image's USER
# Exit codes (README): 2 bad input/conflict and 4 workload/verification failed never change on
# a retry; 1, 3, 5 and a killed pod may.
RETRY_EXPRESSION = "!(lastRetry.exitCode in ['2', '4'])"
TTL_STRATEGY = {"secondsAfterSuccess": 86400, "secondsAfterFailure": 7 * 86400}
POD_GC = {"strategy": "OnPodSuccess"}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": LAUNCHER_UID,
    "runAsGroup": LAUNCHER_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
TMP_VOLUME = {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
LAUNCHER_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


def harden(doc: dict[str, Any]) -> dict[str, Any]:
    """The WorkflowTemplate/Workflow spec (or CronWorkflow workflowSpec) made safe to run."""
    doc = copy.deepcopy(doc)
    spec = doc["spec"]["workflowSpec"] if doc["kind"] == "CronWorkflow" else doc["spec"]
    fresh = copy.deepcopy  # every use its own copy: no YAML anchors in the output
    spec.setdefault("ttlStrategy", fresh(TTL_STRATEGY))
    spec.setdefault("podGC", fresh(POD_GC))
    spec.setdefault("securityContext", fresh(POD_SECURITY))
    # A template a caller's workflow reaches by templateRef brings its own volumes, pod
    # security context and (when fixed) service account: Argo does not bring the
    # WorkflowTemplate's spec-level ones along (template-level volumes: Argo >= 3.x/4.x).
    account = spec.get("serviceAccountName", "")
    for template in spec.get("templates", []):
        container = template.get("container")
        if container is not None:
            container["securityContext"] = fresh(CONTAINER_SECURITY)
            container["volumeMounts"] = [*container.get("volumeMounts", []), fresh(TMP_MOUNT)]
            container.setdefault("resources", fresh(LAUNCHER_RESOURCES))
            template["volumes"] = [*template.get("volumes", []), fresh(TMP_VOLUME)]
            template.setdefault("securityContext", fresh(POD_SECURITY))
            if account and "{{" not in account:
                template.setdefault("serviceAccountName", account)
        if "retryStrategy" in template:
            template["retryStrategy"]["expression"] = RETRY_EXPRESSION
    return doc


def template_manifest(name: str) -> dict[str, Any]:
    """A shipped WorkflowTemplate (``argo_workflow.WORKFLOW_TEMPLATES``), hardened."""
    return harden(aw.workflow_template_manifest(name))


def training_template_manifest() -> dict[str, Any]:
    return template_manifest(aw.TEMPLATE_NAME)


def verify_only_template_manifest() -> dict[str, Any]:
    """provision -> verify, teardown on exit: a fabric health check without training."""
    return template_manifest(VERIFY_ONLY_NAME)


def _cron(name: str, schedule: str, description: str, workflow_spec: dict[str, Any]) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "CronWorkflow",
        "metadata": {
            "name": name,
            "labels": {**aw.LABELS, "app.kubernetes.io/name": name},
            "annotations": {"workflows.argoproj.io/description": description},
        },
        "spec": {
            "schedules": [schedule],
            "timezone": "UTC",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 7,
            "workflowSpec": workflow_spec,
        },
    }


def fabric_check_cron_manifest() -> dict[str, Any]:
    """Every night: the verify-only template with its defaults (patch them with kustomize)."""
    spec = {
        "workflowTemplateRef": {"name": VERIFY_ONLY_NAME},
        "ttlStrategy": copy.deepcopy(TTL_STRATEGY),
        "podGC": copy.deepcopy(POD_GC),
    }
    return _cron(
        FABRIC_CHECK_NAME, "0 2 * * *", "Nightly NVLink fabric check (mnnvl-verify-only).", spec
    )


def reap_cron_manifest() -> dict[str, Any]:
    """Every hour: ``mnnvl reap`` of runs older than two days whose exit handler never ran.

    Two days exceeds the longest run the templates allow (train 8 h, verifies 1 h each).
    """
    reap = {
        "name": "reap",
        "inputs": {"parameters": [{"name": "older-than-s", "value": "172800"}]},
        "container": {
            "image": DEFAULT_LAUNCHER_IMAGE,
            "command": ["mnnvl"],
            "args": [
                "reap",
                "--namespace",
                "{{workflow.namespace}}",
                "--older-than-s",
                "{{inputs.parameters.older-than-s}}",
            ],
        },
        "retryStrategy": {"limit": t.RETRY_LIMIT, "retryPolicy": "Always"},
    }
    spec = {
        "entrypoint": "reap",
        "serviceAccountName": aw.DEFAULT_SERVICE_ACCOUNT,
        "templates": [reap],
    }
    cron = _cron(REAP_NAME, "17 * * * *", "Hourly clean-up of orphaned runs (mnnvl reap).", spec)
    return harden(cron)

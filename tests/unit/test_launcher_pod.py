"""Launcher pods carry one set of settings on KFP and on Argo, from ``launcher_pod``.

The compiled YAML a cluster applies is read back: every step's pod of every pipeline, in the
KFP IR and in the Argo WorkflowTemplate, must run as the same user with the same requests,
limits and labels, and those values are the ones ``mnnvl.components.launcher_pod`` declares.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hera.workflows import Container

from mnnvl.components import launcher_pod as lp
from mnnvl.inputs import surface
from mnnvl.pipelines import argo_workflow

REPO = Path(__file__).resolve().parents[2]
COMPILED = REPO / "pipelines" / "compiled"
# KFP names an executor after its component (a second use gets a suffix: exec-verify-nvlink-2).
KFP_COMPONENT_STEPS = {
    "provision": "provision",
    "train-sharded": "train",
    "verify-nvlink": "verify",
    "launch-workload": "launch",
    "teardown-domain": "teardown",
}


def _expected(step: str) -> dict[str, Any]:
    return {
        "uid": lp.UID,
        "gid": lp.GID,
        "non_root": lp.RUN_AS_NON_ROOT,
        "cpu_request": lp.CPU_REQUEST,
        "memory_request": lp.MEMORY_REQUEST,
        "memory_limit": lp.MEMORY_LIMIT,
        "labels": lp.labels(step),
    }


def _kfp_step(executor: str) -> str:
    name = executor.removeprefix("exec-")
    name = re.sub(r"-\d+$", "", name)
    for prefix, step in KFP_COMPONENT_STEPS.items():
        if name.startswith(prefix):
            return step
    raise AssertionError(f"unknown executor {executor}")


def kfp_launcher_pods(pipeline: str) -> dict[str, dict[str, Any]]:
    """Step -> launcher-pod settings, read from the compiled KFP IR and its platform spec."""
    spec, platform = yaml.safe_load_all((COMPILED / f"{pipeline}.kfp.yaml").read_text())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    pods: dict[str, dict[str, Any]] = {}
    for executor, config in executors.items():
        step = _kfp_step(executor)
        container = spec["deploymentSpec"]["executors"][executor]["container"]
        security = config["securityContext"]
        pod = {
            "uid": int(security["runAsUser"]),
            "gid": int(security["runAsGroup"]),
            "non_root": security["runAsNonRoot"],
            "cpu_request": container["resources"]["resourceCpuRequest"],
            "memory_request": container["resources"]["resourceMemoryRequest"],
            "memory_limit": container["resources"]["resourceMemoryLimit"],
            "labels": config.get("podMetadata", {}).get("labels", {}),
        }
        assert pods.setdefault(step, pod) == pod, (pipeline, executor)
    return pods


def argo_launcher_pods(pipeline: str) -> dict[str, dict[str, Any]]:
    """Step -> launcher-pod settings, read from the compiled Argo WorkflowTemplate."""
    spec = yaml.safe_load((COMPILED / f"{pipeline}.workflowtemplate.yaml").read_text())["spec"]
    security = spec["securityContext"]
    pods = {}
    for template in spec["templates"]:
        container = template.get("container")
        if container is None:
            continue
        resources = container["resources"]
        pods[template["name"]] = {
            "uid": security["runAsUser"],
            "gid": security["runAsGroup"],
            "non_root": security["runAsNonRoot"],
            "cpu_request": resources["requests"]["cpu"],
            "memory_request": resources["requests"]["memory"],
            "memory_limit": resources["limits"]["memory"],
            "labels": template.get("metadata", {}).get("labels", {}),
        }
    return pods


@pytest.mark.parametrize("pipeline", sorted(surface.PIPELINES))
def test_kfp_and_argo_launcher_pods_carry_the_same_settings_from_one_module(pipeline: str):
    kfp = kfp_launcher_pods(pipeline)
    argo = argo_launcher_pods(pipeline)
    steps = {task.step for task in surface.PIPELINES[pipeline].tasks}
    assert set(kfp) == steps and steps <= set(argo), (sorted(kfp), sorted(argo))
    for step in sorted(steps):
        assert kfp[step] == argo[step] == _expected(step), step


def test_the_launcher_uid_is_the_launcher_images_user():
    lines = (REPO / "images" / "launcher.Dockerfile").read_text().splitlines()
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")][-1:]
    assert user == f"{lp.UID}:{lp.GID}"


@pytest.mark.parametrize("name", argo_workflow.WORKFLOW_TEMPLATES)
def test_the_hera_workflow_template_itself_is_hardened_and_is_what_ships(name: str):
    """Whoever builds the template with hera (and submits it with hera's client) gets the
    same hardened object the GitOps directory ships: nothing is added after ``to_dict()``."""
    template = argo_workflow.build_workflow_template(name)
    assert template.pod_gc is not None and template.pod_gc.strategy == "OnPodSuccess"
    assert template.ttl_strategy is not None and template.ttl_strategy.seconds_after_failure
    assert template.security_context is not None
    assert template.security_context.run_as_user == lp.UID
    # Each step template brings its own /tmp volume (templateRef does not bring spec.volumes).
    containers = [t for t in template.templates if isinstance(t, Container)]
    assert containers and all(
        [v.name for v in c.volumes or []] == [lp.TMP_VOLUME] for c in containers
    )
    shipped = REPO / "pipelines" / "gitops" / "argo" / f"{name}.workflowtemplate.yaml"
    assert template.to_dict() == yaml.safe_load(shipped.read_text())

"""``mnnvl preflight`` on each stack the simulator plays: clean where the stack is whole, the
fix named where a piece is missing, SKIPPED rows where only the namespaced Role is granted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from mnnvl.cli import main as cli
from mnnvl.contract import exit_codes
from mnnvl.manifests import CLIQUE_LABEL
from mnnvl.sim import SimCluster

STACKS = [("device-plugin", "daemons"), ("dra", "daemons"), ("dra", "hostManaged")]


def preflight(sim: SimCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = cli.main(["preflight", "--kubeconfig", sim.kubeconfig_path, *argv])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    result["code"] = code
    return result


def rows(result: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {r["check"]: r for r in result["rows"]}


@pytest.mark.parametrize(("gpu_stack", "imex_mode"), STACKS)
def test_preflight_runs_clean_on_each_stack_with_the_cluster_reader(
    gpu_stack: str, imex_mode: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with SimCluster(
        nodes=2, gpus_per_node=4, gpu_stack=gpu_stack, imex_mode=imex_mode, cluster_reader=True
    ) as sim:
        result = preflight(sim, capsys, "--nodes", "2", "--report-dir", str(tmp_path))
    assert result["code"] == exit_codes.OK, result
    found = rows(result)
    skipped = {k for k, r in found.items() if r["status"] != "PASS"}
    assert skipped == {"kueue"}, found  # no --queue-name given
    assert (
        "--gpu-mode auto runs as " + ("limits" if gpu_stack == "device-plugin" else "claim")
        in (found["gpu-stack"]["saw"])
    )
    assert found["imex-mode"]["saw"].startswith(imex_mode)
    assert "2 of 2 nodes carry" in found["clique-labels"]["saw"]
    ctrf = json.loads((tmp_path / "preflight.ctrf.json").read_text())
    assert ctrf["results"]["summary"]["passed"] == len(found) - 1


def test_a_dra_only_stack_with_gpu_mode_limits_fails_naming_gpu_mode_claim(capsys):
    with SimCluster(nodes=2, gpus_per_node=4, gpu_stack="dra", cluster_reader=True) as sim:
        result = preflight(sim, capsys, "--gpu-mode", "limits")
    assert result["code"] == exit_codes.FAILED
    assert "gpu-stack FAIL" in result["error"] and "--gpu-mode claim" in result["error"]


def test_gpus_asked_of_a_cluster_without_gpus_fail_naming_gpus_per_node_0(capsys):
    with SimCluster(nodes=2, gpus_per_node=0, cluster_reader=True) as sim:
        result = preflight(sim, capsys, "--gpus-per-node", "4")
    assert result["code"] == exit_codes.FAILED
    assert "gpu-stack FAIL" in result["error"] and "--gpus-per-node 0" in result["error"]


def test_no_computedomain_crd_fails_naming_the_dra_driver_install(capsys):
    with SimCluster(nodes=2, crd_installed=False, cluster_reader=True) as sim:
        result = preflight(sim, capsys, "--gpus-per-node", "0")
    assert result["code"] == exit_codes.FAILED
    assert "computedomain-crd FAIL" in result["error"]
    assert "resources.computeDomains.enabled=true" in result["error"]


def test_nodes_without_the_clique_label_fail_naming_who_sets_it(capsys):
    with SimCluster(nodes=2, cluster_reader=True) as sim:
        admin = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        core = kubernetes.client.CoreV1Api(admin)
        for node in core.list_node().items:
            body = {"metadata": {"labels": {CLIQUE_LABEL: None}}}
            core.patch_node(node.metadata.name, body)
        result = preflight(sim, capsys, "--gpus-per-node", "0")
    assert result["code"] == exit_codes.FAILED
    assert f"clique-labels FAIL (0 of 2 nodes carry {CLIQUE_LABEL})" in result["error"]
    assert "GPU Feature Discovery" in result["error"] and "gpuCliqueLabelEnabled" in result["error"]


def test_cliques_under_a_providers_own_label_key_pass_with_clique_label(capsys):
    key = "cloud.example.com/nvlink-domain"
    with SimCluster(nodes=2, cluster_reader=True, clique_label=key) as sim:
        default = preflight(sim, capsys, "--gpus-per-node", "0")
        theirs = rows(preflight(sim, capsys, "--gpus-per-node", "0", "--clique-label", key))
    assert default["code"] == exit_codes.FAILED
    assert "clique-labels FAIL" in default["error"] and "--clique-label" in default["error"]
    assert theirs["clique-labels"]["status"] == "PASS" and key in theirs["clique-labels"]["saw"]
    assert theirs["channel-devices"]["status"] == "PASS"


def test_a_group_larger_than_any_clique_fails(capsys):
    with SimCluster(nodes=4, cliques=2, cluster_reader=True) as sim:
        result = preflight(sim, capsys, "--nodes", "4", "--gpus-per-node", "0")
    assert result["code"] == exit_codes.FAILED
    assert "1 clique(s) of >= 4 nodes" in result["error"]


def test_only_the_namespaced_role_gives_skipped_rows_naming_the_overlay(capsys):
    with SimCluster(nodes=2, gpus_per_node=4) as sim:
        result = preflight(sim, capsys)
    assert result["code"] == exit_codes.OK, result
    found = rows(result)
    assert found["computedomain-crd"]["status"] == "PASS"
    assert found["runner-permissions"]["status"] == "PASS"
    for check in ("device-classes", "clique-labels", "channel-devices", "gpu-stack", "imex-mode"):
        assert found[check]["status"] == "SKIPPED"
        assert "manifests/overlays/cluster-reader" in found[check]["saw"]


def test_a_runner_without_its_role_fails_naming_manifests_base(capsys):
    with SimCluster(nodes=2) as sim:
        admin = kubernetes.config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        kubernetes.client.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding(
            "mnnvl-runner", "default"
        )
        result = preflight(sim, capsys, "--gpus-per-node", "0")
    assert result["code"] == exit_codes.FAILED
    assert "runner-permissions FAIL" in result["error"]
    assert "kubectl apply -n default -k manifests/base" in result["error"]

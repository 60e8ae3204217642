"""The checked-in compiled YAML equals a fresh compile, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnnvl.pipelines import compile as mc


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mc.compile_all(tmp_path_factory.mktemp("compiled"))


def test_compiled_files_match_a_fresh_compile(fresh: dict[str, Path]) -> None:
    checked_in = mc.default_paths()
    stale = [
        rel
        for rel, path in sorted(fresh.items())
        if not checked_in[rel].is_file() or checked_in[rel].read_bytes() != path.read_bytes()
    ]
    assert not stale, f"stale compiled files {stale}: run `make compile` and commit the result"


def test_compile_is_deterministic(fresh: dict[str, Path], tmp_path: Path) -> None:
    again = mc.compile_all(tmp_path)
    assert {rel: p.read_bytes() for rel, p in again.items()} == {
        rel: p.read_bytes() for rel, p in fresh.items()
    }


def test_every_expected_file_is_produced(fresh: dict[str, Path]) -> None:
    assert set(fresh) == {
        "components/kfp_components.py",
        "components/launch_workload.yaml",
        "pipelines/compiled/mnnvl-custom.kfp.yaml",
        "pipelines/compiled/mnnvl-custom.workflowtemplate.yaml",
        "pipelines/compiled/mnnvl-launch.workflowtemplate.yaml",
        "pipelines/compiled/mnnvl-verify-only.workflowtemplate.yaml",
        "components/provision_domain.yaml",
        "components/train_sharded.yaml",
        "components/verify_nvlink.yaml",
        "components/teardown_domain.yaml",
        "pipelines/compiled/mnnvl-training.kfp.yaml",
        "pipelines/compiled/mnnvl-verify-only.kfp.yaml",
        "pipelines/compiled/mnnvl-training.k8s.yaml",
        "pipelines/compiled/mnnvl-training.workflowtemplate.yaml",
        "pipelines/compiled/mnnvl-training.workflow.yaml",
    }


def test_check_mode_reports_a_stale_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Point the checked-in locations at an empty directory: everything is stale, exit 1.
    monkeypatch.setattr(mc, "COMPILED_DIR", tmp_path / "compiled")
    monkeypatch.setattr(mc, "COMPONENTS_DIR", tmp_path / "components")
    assert mc.main(["--check"]) == 1
    monkeypatch.undo()
    assert mc.main(["--check"]) == 0


def test_kubernetes_manifests_hold_pipeline_and_version(fresh: dict[str, Path]) -> None:
    import yaml

    docs = list(yaml.safe_load_all(fresh["pipelines/compiled/mnnvl-training.k8s.yaml"].read_text()))
    kinds = [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs]
    assert kinds == [
        ("Pipeline", "mnnvl-training", "kubeflow"),
        ("PipelineVersion", mc.version_name("mnnvl-training"), "kubeflow"),
    ]
    assert docs[1]["spec"]["pipelineName"] == "mnnvl-training"
    assert docs[1]["spec"]["pipelineSpec"]["pipelineInfo"]["name"] == "mnnvl-training"

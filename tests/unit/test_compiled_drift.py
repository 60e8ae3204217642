"""The checked-in compiled YAML equals a fresh compile, byte for byte."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from mnnvl.pipelines import compile as mc


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mc.compile_all(tmp_path_factory.mktemp("compiled"))


def test_compiled_files_match_a_fresh_compile(fresh: dict[str, Path]) -> None:
    stale = [
        rel
        for rel, path in sorted(fresh.items())
        if not (mc.ROOT / rel).is_file() or (mc.ROOT / rel).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"stale compiled files {stale}: run `make compile` and commit the result"


def test_compile_is_deterministic(fresh: dict[str, Path], tmp_path: Path) -> None:
    again = mc.compile_all(tmp_path)
    assert {rel: p.read_bytes() for rel, p in again.items()} == {
        rel: p.read_bytes() for rel, p in fresh.items()
    }


def test_every_expected_file_is_produced(fresh: dict[str, Path]) -> None:
    assert set(fresh) == {
        "components/launch_workload.yaml",
        "pipelines/compiled/mnnvl-custom.kfp.yaml",
        "pipelines/compiled/mnnvl-custom.workflowtemplate.yaml",
        "pipelines/compiled/mnnvl-launch.workflowtemplate.yaml",
        "pipelines/compiled/mnnvl-verify-only.workflowtemplate.yaml",
        "components/preflight_cluster.yaml",
        "components/provision_domain.yaml",
        "components/train_sharded.yaml",
        "components/verify_nvlink.yaml",
        "components/teardown_domain.yaml",
        "pipelines/compiled/mnnvl-training.kfp.yaml",
        "pipelines/compiled/mnnvl-verify-only.kfp.yaml",
        "pipelines/compiled/mnnvl-training.workflowtemplate.yaml",
        "pipelines/compiled/mnnvl-training.workflow.yaml",
        "pipelines/gitops/kfp/kustomization.yaml",
        "pipelines/gitops/kfp/mnnvl-training.k8s.yaml",
        "pipelines/gitops/kfp/mnnvl-verify-only.k8s.yaml",
        "pipelines/gitops/kfp/mnnvl-custom.k8s.yaml",
        "pipelines/gitops/argo/kustomization.yaml",
        "pipelines/gitops/argo/mnnvl-custom.workflowtemplate.yaml",
        "pipelines/gitops/argo/mnnvl-launch.workflowtemplate.yaml",
        "pipelines/gitops/argo/mnnvl-training.workflowtemplate.yaml",
        "pipelines/gitops/argo/mnnvl-verify-only.workflowtemplate.yaml",
        "pipelines/gitops/argo/mnnvl-nightly-fabric-check.cronworkflow.yaml",
        "pipelines/gitops/argo/mnnvl-reap.cronworkflow.yaml",
    }


def test_check_mode_reports_a_stale_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Point the checked-in locations at an empty directory: everything is stale, exit 1.
    monkeypatch.setattr(mc, "ROOT", tmp_path)
    assert mc.main(["--check"]) == 1
    monkeypatch.undo()
    assert mc.main(["--check"]) == 0


@pytest.mark.parametrize("name", ["mnnvl-training", "mnnvl-verify-only"])
def test_kubernetes_manifests_hold_pipeline_and_a_version_named_by_content(
    fresh: dict[str, Path], name: str
) -> None:
    import yaml

    from mnnvl.pipelines import kfp_pipeline as kp

    docs = list(yaml.safe_load_all(fresh[f"pipelines/gitops/kfp/{name}.k8s.yaml"].read_text()))
    assert [d["kind"] for d in docs] == ["Pipeline", "PipelineVersion"]
    assert all("namespace" not in d["metadata"] for d in docs), "kustomize sets the namespace"
    version = docs[1]["metadata"]["name"]
    assert version == mc.version_name(name, mc.pipeline_spec(kp.PIPELINES[name]))
    assert version.startswith(f"{name}-v") and len(version) <= 63
    assert docs[1]["spec"]["pipelineName"] == name
    assert docs[1]["spec"]["pipelineSpec"]["pipelineInfo"]["name"] == name


def test_a_changed_pipeline_spec_gets_a_new_version_name() -> None:
    from mnnvl.pipelines import kfp_pipeline as kp

    spec = mc.pipeline_spec(kp.verify_only_pipeline)
    assert mc.version_name("p", spec) == mc.version_name("p", copy.deepcopy(spec))
    changed = copy.deepcopy(spec)
    changed[0]["root"]["inputDefinitions"]["parameters"]["nodes"]["defaultValue"] = 4
    assert mc.version_name("p", changed) != mc.version_name("p", spec)


def test_gitops_kustomizations_list_every_file_beside_them(fresh: dict[str, Path]) -> None:
    import yaml

    for engine in ("kfp", "argo"):
        rel = f"pipelines/gitops/{engine}/kustomization.yaml"
        listed = yaml.safe_load(fresh[rel].read_text())["resources"]
        beside = [Path(r).name for r in fresh if r.startswith(f"pipelines/gitops/{engine}/")]
        assert sorted(listed) == sorted(n for n in beside if n != "kustomization.yaml")


def test_compile_with_user_images_leaves_no_default_image(tmp_path: Path) -> None:
    import yaml
    from kfp import components

    from mnnvl.inputs.defaults import DEFAULT_IMAGE, DEFAULT_LAUNCHER_IMAGE

    launcher, runtime = "reg.example.com/team/launcher:1.2", "reg.example.com/team/runtime:1.2"
    argv = ["--launcher-image", launcher, "--runtime-image", runtime, "--out", str(tmp_path)]
    assert mc.main(argv) == 0
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == len(mc.targets())
    for path in files:
        text = path.read_text()
        assert DEFAULT_LAUNCHER_IMAGE not in text and DEFAULT_IMAGE not in text, path
    ir = next(
        yaml.safe_load_all((tmp_path / "pipelines/compiled/mnnvl-custom.kfp.yaml").read_text())
    )
    images = {e["container"]["image"] for e in ir["deploymentSpec"]["executors"].values()}
    assert images == {launcher}
    assert ir["root"]["inputDefinitions"]["parameters"]["image"]["defaultValue"] == runtime
    wt = yaml.safe_load(
        (tmp_path / "pipelines/compiled/mnnvl-training.workflowtemplate.yaml").read_text()
    )
    params = {p["name"]: p["value"] for p in wt["spec"]["arguments"]["parameters"]}
    assert (params["launcher-image"], params["image"]) == (launcher, runtime)
    loaded = components.load_component_from_file(str(tmp_path / "components/launch_workload.yaml"))
    assert loaded.component_spec.implementation.container.image == launcher


def test_compile_refuses_a_bad_image_reference(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        mc.main(["--launcher-image", "Not An Image", "--out", "unused"])
    assert err.value.code == 2
    assert "launcher_image" in capsys.readouterr().err


def _version_doc(path: Path) -> dict:
    import yaml

    docs = yaml.safe_load_all(path.read_text())
    return next(d for d in docs if d["kind"] == "PipelineVersion")


def test_an_image_bump_gets_a_new_pipeline_version_name(tmp_path: Path) -> None:
    """KFP keeps a version's spec immutable: the name must hash the spec as written."""
    from mnnvl.inputs.defaults import DEFAULT_LAUNCHER_IMAGE
    from mnnvl.pipelines import kfp_pipeline as kp

    versions = {}
    for tag in ("1", "2"):
        path = tmp_path / f"{tag}.k8s.yaml"
        images = {DEFAULT_LAUNCHER_IMAGE: f"reg.example.com/l:{tag}"}
        mc._kfp_k8s(kp.verify_only_pipeline, "mnnvl-verify-only", images)(path)
        mc.retag_file(path, images)  # what compile_all does with --launcher-image
        doc = _version_doc(path)
        assert f"reg.example.com/l:{tag}" in str(doc["spec"]["pipelineSpec"])
        versions[tag] = doc["metadata"]["name"]
        assert versions[tag] == mc.version_name(
            "mnnvl-verify-only", mc._retag(mc.pipeline_spec(kp.verify_only_pipeline), images)
        )
    assert versions["1"] != versions["2"]


def test_gitops_applies_the_pipeline_before_its_versions_and_runs_expire(
    fresh: dict[str, Path],
) -> None:
    import yaml

    for name in ("mnnvl-training", "mnnvl-verify-only", "mnnvl-custom"):
        docs = list(yaml.safe_load_all(fresh[f"pipelines/gitops/kfp/{name}.k8s.yaml"].read_text()))
        waves = {d["kind"]: int(d["metadata"]["annotations"][mc.SYNC_WAVE]) for d in docs}
        assert waves["Pipeline"] < waves["PipelineVersion"], name
        config = docs[1]["spec"]["platformSpec"]["platforms"]["kubernetes"]["pipelineConfig"]
        assert config == {"resourceTtlOnFailure": 604800, "resourceTtlOnSuccess": 86400}, name

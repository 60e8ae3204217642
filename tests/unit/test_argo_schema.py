"""The Argo WorkflowTemplate and Workflow validate STRICTLY against Argo's published schemas."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from mnnvl.pipelines import argo_workflow as aw

SCHEMAS = ["schema.json", "schema-v4.0.10.json"]
COMPILED = Path(aw.__file__).resolve().parent / "compiled"


def strict_copy(schema: dict[str, Any]) -> dict[str, Any]:
    """Copy of the schema where every object definition with ``properties`` rejects extras.

    Definitions that already say something about ``additionalProperties`` (maps) or carry
    ``x-kubernetes-preserve-unknown-fields`` (open objects) are left as they are.
    """
    strict = copy.deepcopy(schema)
    for definition in strict["definitions"].values():
        if "properties" not in definition or "additionalProperties" in definition:
            continue
        if definition.get("x-kubernetes-preserve-unknown-fields"):
            continue
        definition["additionalProperties"] = False
    return strict


@pytest.fixture(scope="module", params=SCHEMAS)
def strict_validator(request: pytest.FixtureRequest, schema_dir: Path) -> Any:
    schema = json.loads((schema_dir / "argo-workflows" / request.param).read_text())
    return jsonschema.Draft202012Validator(strict_copy(schema))


def _errors(validator: Any, doc: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("name", aw.WORKFLOW_TEMPLATES)
def test_workflow_templates_validate_strictly(strict_validator: Any, name: str) -> None:
    assert _errors(strict_validator, aw.build_workflow_template(name).to_dict()) == []


def test_workflow_validates_strictly(strict_validator: Any) -> None:
    assert _errors(strict_validator, aw.workflow_manifest()) == []


def test_compiled_argo_files_validate_strictly(strict_validator: Any) -> None:
    names = [f"{n}.workflowtemplate.yaml" for n in aw.WORKFLOW_TEMPLATES]
    for name in [*names, "mnnvl-training.workflow.yaml"]:
        doc = yaml.safe_load((COMPILED / name).read_text())
        assert _errors(strict_validator, doc) == [], name


def test_strict_schema_rejects_unknown_template_field(strict_validator: Any) -> None:
    doc = aw.build_workflow_template().to_dict()
    doc["spec"]["templates"][0]["retryStrategyy"] = {"limit": "2"}
    errors = _errors(strict_validator, doc)
    assert errors, "a misspelled template field must be rejected"


def test_strict_schema_rejects_unknown_container_field(strict_validator: Any) -> None:
    doc = aw.build_workflow_template().to_dict()
    train = next(t for t in doc["spec"]["templates"] if t["name"] == "train")
    train["container"]["imagePullPolcy"] = "Always"
    assert _errors(strict_validator, doc)


def test_strict_schema_still_accepts_maps(strict_validator: Any) -> None:
    doc = aw.build_workflow_template().to_dict()
    doc["metadata"]["labels"]["example.com/any-key"] = "any-value"
    assert _errors(strict_validator, doc) == []


def test_plain_schema_misses_unknown_fields(schema_dir: Path) -> None:
    # Why the strict copy exists: the published schema accepts typos.
    schema = json.loads((schema_dir / "argo-workflows" / "schema.json").read_text())
    doc = aw.build_workflow_template().to_dict()
    doc["spec"]["templates"][0]["retryStrategyy"] = {"limit": "2"}
    assert _errors(jsonschema.Draft202012Validator(schema), doc) == []


def test_retry_limits_are_strings_and_workload_steps_retry_without_a_window() -> None:
    templates = {t["name"]: t for t in aw.build_workflow_template().to_dict()["spec"]["templates"]}
    retried = {name for name, t in templates.items() if "retryStrategy" in t}
    assert retried == {"provision", "teardown", "verify", "train", "launch"}
    for name in retried:
        assert templates[name]["retryStrategy"]["limit"] == "2"
        assert isinstance(templates[name]["retryStrategy"]["backoff"]["factor"], str)
    # A training step may be lost hours in: no maxDuration (Argo counts it from the first
    # attempt's start), the template's activeDeadlineSeconds bounds each attempt.
    assert "maxDuration" not in templates["train"]["retryStrategy"]["backoff"]
    assert templates["train"]["activeDeadlineSeconds"]


def test_exit_handler_tears_down() -> None:
    spec = aw.build_workflow_template().to_dict()["spec"]
    assert spec["onExit"] == aw.EXIT_HANDLER
    exit_dag = next(t for t in spec["templates"] if t["name"] == spec["onExit"])
    assert [task["template"] for task in exit_dag["dag"]["tasks"]] == ["teardown"]


def test_dag_runs_provision_verify_train_verify_in_order() -> None:
    spec = aw.build_workflow_template().to_dict()["spec"]
    main = next(t for t in spec["templates"] if t["name"] == spec["entrypoint"])
    tasks = {task["name"]: task for task in main["dag"]["tasks"]}
    assert "depends" not in tasks["provision"]
    assert tasks["verify-pre"]["depends"] == "provision"
    assert tasks["train"]["depends"] == "verify-pre"
    assert tasks["verify-post"]["depends"] == "train"
    purposes = {
        name: {p["name"]: p["value"] for p in tasks[name]["arguments"]["parameters"]}["purpose"]
        for name in ("verify-pre", "verify-post")
    }
    assert purposes == {"verify-pre": "verify-pre", "verify-post": "verify-post"}


def test_every_step_uses_workflow_uid_as_run_id_and_writes_result() -> None:
    templates = aw.build_workflow_template().to_dict()["spec"]["templates"]
    containers = [t for t in templates if "container" in t]
    steps = {"provision", "train", "verify", "launch", "teardown"}
    assert {t["name"] for t in containers} == steps | {"preflight"}
    for template in containers:
        args = template["container"]["args"]
        assert args[0] == template["name"]
        if template["name"] == "preflight":  # reads the cluster; no run, no run id
            assert "--run-id" not in args
        else:
            assert args[args.index("--run-id") + 1] == "{{workflow.uid}}"
        assert args[args.index("--result-path") + 1] == "/tmp/result.json"
        result = template["outputs"]["parameters"][0]
        assert (result["name"], result["valueFrom"]["path"]) == ("result", "/tmp/result.json")


def test_long_steps_have_deadlines_and_service_account_is_a_parameter() -> None:
    spec = aw.build_workflow_template().to_dict()["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    for name in ("train", "verify", "launch"):
        assert templates[name]["activeDeadlineSeconds"] == "{{inputs.parameters.deadline-s}}"
    assert spec["serviceAccountName"] == "{{workflow.parameters.launcher-service-account}}"
    params = {p["name"] for p in spec["arguments"]["parameters"]}
    assert "launcher-service-account" in params and "pod" in params  # pod.worker_service_account
    assert "service-account" not in params  # one name for two accounts was easy to confuse


def test_every_task_argument_names_a_template_input_or_workflow_parameter() -> None:
    spec = aw.build_workflow_template().to_dict()["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    params = {p["name"] for p in spec["arguments"]["parameters"]}
    for dag in (t for t in spec["templates"] if "dag" in t):
        for task in dag["dag"]["tasks"]:
            inputs = {p["name"] for p in templates[task["template"]]["inputs"]["parameters"]}
            for arg in task["arguments"]["parameters"]:
                assert arg["name"] in inputs, (task["name"], arg["name"])
                value = arg["value"]
                if value.startswith("{{workflow.parameters."):
                    assert value[len("{{workflow.parameters.") : -2] in params | {"json"}


def test_workflow_references_the_template() -> None:
    doc = aw.workflow_manifest()
    assert doc["kind"] == "Workflow"
    assert doc["spec"]["workflowTemplateRef"] == {"name": "mnnvl-training"}
    assert doc["metadata"]["generateName"] == "mnnvl-training-"


def _resolve(arg: str, defaults: dict[str, str]) -> str:
    """Substitute what Argo would, using the template inputs' defaults."""
    if arg.startswith("{{="):
        name = arg.split("'")[1]
        return f"--{name}" if defaults[name] == "true" else f"--no-{name}"
    arg = arg.replace("{{workflow.uid}}", "0b7c0f4e-6d5c-4f7a-9d55-6f0e1f3c2a11")
    for name, value in defaults.items():
        arg = arg.replace(f"{{{{inputs.parameters.{name}}}}}", value)
    return arg


def test_template_commands_parse_with_the_cli() -> None:
    from mnnvl.cli.main import build_parser

    parser = build_parser()
    for template in aw.build_workflow_template().to_dict()["spec"]["templates"]:
        if "container" not in template:
            continue
        defaults = {p["name"]: p.get("default", "") for p in template["inputs"]["parameters"]}
        defaults["pipeline"] = "mnnvl-training"
        args = [_resolve(a, defaults) for a in template["container"]["args"]]
        assert not any("{{" in a for a in args), args
        ns = parser.parse_args(args)
        if template["name"] != "preflight":
            assert ns.run_id == "0b7c0f4e-6d5c-4f7a-9d55-6f0e1f3c2a11"
        assert ns.result_path == "/tmp/result.json"


GITOPS = Path(aw.__file__).resolve().parent / "gitops" / "argo"


def _gitops_docs() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(GITOPS.glob("mnnvl-*.yaml"))}


def test_gitops_argo_files_validate_strictly_and_name_no_namespace(strict_validator: Any) -> None:
    docs = _gitops_docs()
    assert {d["kind"] for d in docs.values()} == {"WorkflowTemplate", "CronWorkflow"}
    for name, doc in docs.items():
        assert _errors(strict_validator, doc) == [], name
        assert "namespace" not in doc["metadata"], name


def _workflow_specs() -> dict[str, dict[str, Any]]:
    specs = {}
    for name, doc in _gitops_docs().items():
        specs[name] = doc["spec"]["workflowSpec"] if doc["kind"] == "CronWorkflow" else doc["spec"]
    specs["compiled"] = yaml.safe_load(
        (COMPILED / "mnnvl-training.workflowtemplate.yaml").read_text()
    )["spec"]
    return specs


def test_every_launcher_pod_is_non_root_read_only_and_requests_resources() -> None:
    for name, spec in _workflow_specs().items():
        if "workflowTemplateRef" in spec:
            continue  # runs a template checked here
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["podGC"] == {"strategy": "OnPodSuccess"} and spec["ttlStrategy"], name
        for template in spec["templates"]:
            container = template.get("container")
            if container is None:
                continue
            tmp = {v["name"] for v in template["volumes"] if "emptyDir" in v}
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (name, template["name"])
            assert security["readOnlyRootFilesystem"] is True
            assert {m["mountPath"] for m in container["volumeMounts"] if m["name"] in tmp} == {
                "/tmp"
            }, "the result file and matplotlib's cache need a writable /tmp"
            assert container["resources"]["requests"]["cpu"]


WORKLOAD_STEPS = {"train", "verify", "launch"}


def test_retries_only_happen_for_exit_codes_a_retry_can_fix_or_a_lost_pod() -> None:
    """Idempotent steps retry unless the code says a retry cannot help (2, 4); workload steps
    only when their pod was lost (an Error node, 137, 143, or no exit code: -1)."""
    retried = lost = 0
    for name, spec in _workflow_specs().items():
        for template in spec.get("templates", []):
            retry = template.get("retryStrategy")
            if not retry:
                continue
            retried += 1
            if template["name"] in WORKLOAD_STEPS:
                lost += 1
                expected = (
                    "(lastRetry.status == 'Error' || lastRetry.exitCode in ['137', '143', "
                    "'-1']) && !(lastRetry.message matches 'deadline')"
                )
                assert retry["expression"] == expected, (name, template["name"])
            else:
                assert retry["expression"] == "!(lastRetry.exitCode in ['2', '4'])", name
    assert retried >= 3 and lost >= 2  # provision and teardown, reap; train and verify


def test_the_launch_templates_retry_a_lost_step_too() -> None:
    shipped = yaml.safe_load((COMPILED / "mnnvl-launch.workflowtemplate.yaml").read_text())
    by_name = {t["name"]: t for t in shipped["spec"]["templates"]}
    for step in WORKLOAD_STEPS:
        assert "lastRetry.status == 'Error'" in by_name[step]["retryStrategy"]["expression"]


def test_cron_workflows_run_the_fabric_check_nightly_and_reap_in_their_own_namespace() -> None:
    docs = _gitops_docs()
    check = docs["mnnvl-nightly-fabric-check.cronworkflow.yaml"]["spec"]
    assert check["workflowSpec"]["workflowTemplateRef"] == {"name": "mnnvl-verify-only"}
    assert check["concurrencyPolicy"] == "Forbid" and check["schedules"]
    reap = docs["mnnvl-reap.cronworkflow.yaml"]["spec"]["workflowSpec"]["templates"][0]
    args = reap["container"]["args"]
    assert args[:3] == ["reap", "--namespace", "{{workflow.namespace}}"]
    verify_only = docs["mnnvl-verify-only.workflowtemplate.yaml"]["spec"]
    (main,) = [t for t in verify_only["templates"] if t["name"] == verify_only["entrypoint"]]
    tasks = [t["name"] for t in main["dag"]["tasks"]]
    assert tasks == ["provision", "verify"] and verify_only["onExit"] == "exit-handler"


def _caller_workflow(steps: list[str]) -> dict[str, Any]:
    """A user's own Workflow that runs mnnvl-launch's step templates by templateRef."""
    tasks = [
        {
            "name": step,
            "templateRef": {"name": aw.LAUNCH_TEMPLATE_NAME, "template": step},
            "arguments": {"parameters": [{"name": "nodes", "value": "2"}]},
            **({"depends": steps[i - 1]} if i else {}),
        }
        for i, step in enumerate(steps)
    ]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "my-team-run-"},
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "dag": {"tasks": tasks}}]},
    }


def test_launch_templates_work_by_template_ref_from_a_users_workflow(strict_validator):
    """What Argo resolves for a templateRef is the referenced template alone: its volumes,
    pod security context and service account must not come from mnnvl-launch's spec."""
    shipped = yaml.safe_load((COMPILED / "mnnvl-launch.workflowtemplate.yaml").read_text())
    by_name = {t["name"]: t for t in shipped["spec"]["templates"]}
    caller = _caller_workflow(["provision", "launch", "teardown"])
    assert _errors(strict_validator, caller) == []
    caller_volumes = {v["name"] for v in caller["spec"].get("volumes", [])}
    for task in caller["spec"]["templates"][0]["dag"]["tasks"]:
        template = by_name[task["templateRef"]["template"]]
        volumes = caller_volumes | {v["name"] for v in template.get("volumes", [])}
        mounts = {m["name"] for m in template["container"].get("volumeMounts", [])}
        assert mounts and mounts <= volumes, (template["name"], mounts - volumes)
        assert template["securityContext"]["runAsNonRoot"] is True, template["name"]
        assert template["serviceAccountName"] == aw.DEFAULT_SERVICE_ACCOUNT, template["name"]


def test_teardown_retries_have_room_for_every_attempt_at_the_delete_timeout() -> None:
    """Argo stops retrying after backoff.maxDuration: three attempts that each wait up to the
    default delete timeout, plus the backoffs, must fit in it (and match KFP's 3600 s)."""
    from mnnvl.inputs.spec import DomainSpec

    doc = yaml.safe_load((COMPILED / "mnnvl-training.workflowtemplate.yaml").read_text())
    (teardown,) = [t for t in doc["spec"]["templates"] if t["name"] == "teardown"]
    retry = teardown["retryStrategy"]
    attempts = int(retry["limit"]) + 1
    backoffs = sum(15 * 2**i for i in range(attempts - 1))
    needed = attempts * DomainSpec(run_id="x").delete_timeout_s + backoffs
    assert retry["backoff"]["maxDuration"] == "3600s" and needed <= 3600


def test_kfp_and_argo_retry_a_task_alike() -> None:
    """The same retries, backoff and window on both surfaces (KFP's compiled retryPolicy)."""
    argo = yaml.safe_load((COMPILED / "mnnvl-training.workflowtemplate.yaml").read_text())
    (teardown,) = [t for t in argo["spec"]["templates"] if t["name"] == "teardown"]
    docs = yaml.safe_load_all((COMPILED / "mnnvl-training.kfp.yaml").read_text())
    spec = next(d for d in docs if d and "root" in d)
    kfp = spec["root"]["dag"]["tasks"]["teardown-domain"]["retryPolicy"]
    argo_retry = teardown["retryStrategy"]
    assert int(argo_retry["limit"]) == kfp["maxRetryCount"]
    assert argo_retry["backoff"]["duration"] == kfp["backoffDuration"]
    assert float(argo_retry["backoff"]["factor"]) == kfp["backoffFactor"]
    assert argo_retry["backoff"]["maxDuration"] == kfp["backoffMaxDuration"]


def test_the_parameter_check_accepts_exactly_the_argo_only_workflow_parameters() -> None:
    from mnnvl.inputs import surface

    assert set(aw.ARGO_ONLY) == surface.ARGO_ONLY_PARAMETERS

"""Recovery that knows what failed: each failed attempt is attributed from pod status (the
worker's termination message, or its last log lines), a node that keeps failing the gang is
kept out of the next attempt, and a failure no restart can change ends the step.

Each test runs `steps.launch` on its own simulated cluster and checks the exit code, the
message, the restarts in the result and that nothing of the run is left.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from mnnvl import steps
from mnnvl.contract.termination import Evidence
from mnnvl.driver.exclude import without_node
from mnnvl.errors import MnnvlError
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec, WorkloadSpec, from_inputs
from mnnvl.sim import SimCluster
from tests.sim.simkit import Raw, assert_nothing_left, wait_for

# Works until the file named by $GATE exists, then reports.
GATED = (
    "import json, os, time\n"
    "while not os.path.exists(os.environ['GATE']):\n    time.sleep(0.05)\n"
    "print('RESULT ' + json.dumps({'ok': True}), flush=True)\n"
)
# Index 1 fails at once, saying why on its termination message (when $SAY is set) or only
# in its log; index 0 works until the gate opens.
FAILING = (
    "import json, os, sys, time\n"
    "if os.environ['JOB_COMPLETION_INDEX'] == '1':\n"
    "    print('loading batch 40', flush=True)\n"
    "    print('ValueError: batch 40 has no tokens', flush=True)\n"
    "    if os.environ.get('SAY'):\n"
    "        with open(os.environ['MNNVL_TERMINATION_MESSAGE_PATH'], 'w') as f:\n"
    "            f.write(os.environ['SAY'])\n"
    "    sys.exit(1)\n"
    "while not os.path.exists(os.environ['GATE']):\n    time.sleep(0.05)\n"
)
# Works until the gate opens; a worker whose node has been marked bad (a file named after it)
# reports NVLink errors on its termination message and fails.
MARKED = (
    "import json, os, sys, time\n"
    "bad = os.path.join(os.path.dirname(os.environ['GATE']), os.environ['MNNVL_NODE_NAME'])\n"
    "while not os.path.exists(os.environ['GATE']):\n"
    "    if os.path.exists(bad + '.bad'):\n"
    "        with open(os.environ['MNNVL_TERMINATION_MESSAGE_PATH'], 'w') as f:\n"
    "            f.write(open(bad + '.bad').read())\n"
    "        sys.exit(1)\n"
    "    time.sleep(0.05)\n"
    "print('RESULT ' + json.dumps({'ok': True}), flush=True)\n"
)
BAD, GOOD, SPARE = "sim-node-0", "sim-node-1", "sim-node-2"


class Run:
    """A provisioned run on ``sim`` whose launch goes on in a thread."""

    def __init__(self, sim: SimCluster, tmp: Path, **workload: Any) -> None:
        self.sim, self.id = sim, f"bn-{uuid.uuid4().hex[:8]}"
        self.names = RunNames.for_run(self.id)
        self.job = self.names.job("job")
        self.gate = tmp / f"{self.id}.gate"
        (tmp / "gated.py").write_text(GATED)
        (tmp / "failing.py").write_text(FAILING)
        (tmp / "marked.py").write_text(MARKED)
        env = {"PYTHONPATH": str(tmp), "GATE": str(self.gate), **workload.pop("env", {})}
        shape: dict[str, Any] = {"nodes": 2, **workload}
        self.workload = from_inputs(
            WorkloadSpec,
            run_id=self.id,
            purpose="job",
            gpus_per_node=0,
            env=env,
            pods_running_timeout_s=60,
            job_timeout_s=120,
            **shape,
        )
        self.domain = DomainSpec(run_id=self.id, delete_timeout_s=30)
        steps.provision(self.domain, kubeconfig=sim.kubeconfig_path)
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def launch(self, module: str) -> None:
        def target() -> None:
            try:
                self.result = steps.launch(
                    self.workload, module, [], kubeconfig=self.sim.kubeconfig_path
                )
            except BaseException as e:  # handed to the test thread
                self.error = e

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=240)
        assert not self.thread.is_alive(), "the step did not end"

    def close(self) -> None:
        self.gate.touch()
        if self.thread is not None:
            self.thread.join(timeout=120)
        steps.teardown(self.domain, kubeconfig=self.sim.kubeconfig_path)
        assert_nothing_left(self.sim, self.names.selector)
        assert self.sim.processes(self.names.selector) == []


def cluster(nodes: int, **options: Any) -> SimCluster:
    return SimCluster(nodes=nodes, local_gpus=[], imex_delay_s=0.05, **options)


def cordon(sim: SimCluster, node: str, on: bool) -> None:
    Raw(sim).call("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on}})


def job_of(sim: SimCluster, run: Run) -> dict[str, Any]:
    return dict(Raw(sim).get(f"/apis/batch/v1/namespaces/default/jobs/{run.job}"))


def pods_on(sim: SimCluster, run: Run, node: str) -> set[str]:
    """Names of the run's pods bound to ``node`` now."""
    pods = Raw(sim).call("GET", "/api/v1/namespaces/default/pods", labelSelector=run.names.selector)
    return {p["metadata"]["name"] for p in pods["items"] if p["spec"].get("nodeName") == node}


@pytest.mark.slow
@pytest.mark.parametrize("minor", [36, 34], ids=["k8s-1.36-patch", "k8s-1.34-remade"])
def test_a_node_that_fails_the_gang_twice_is_excluded_and_the_run_ends_on_the_other_two(
    tmp_path: Path, minor: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="mnnvl")
    with cluster(3, kubernetes_minor=minor) as sim:
        sim.faults.fail_node(BAD)  # every worker that starts there is killed (137)
        cordon(sim, SPARE, True)  # the first two attempts land on the bad node and its peer
        run = Run(sim, tmp_path, max_restarts=3)
        try:
            run.launch("gated")
            seen: set[str] = set()

            def twice_on_bad() -> bool:
                seen.update(pods_on(sim, run, BAD))
                return len(seen) >= 2

            wait_for(twice_on_bad, 120, "two attempts placed on the bad node")
            cordon(sim, SPARE, False)  # the spare is there for the attempt after the exclusion
            wait_for(lambda: pods_on(sim, run, SPARE), 120, "a pod on the spare node")
            run.gate.touch()
            run.join()
            assert run.error is None, run.error
            result = run.result
            assert result.excluded_nodes == [BAD]
            first, second = result.restarts
            assert [first["n"], second["n"]] == [1, 2]
            assert first["node"] == second["node"] == BAD
            assert (first["excluded"], second["excluded"]) == (None, BAD)
            assert first["exit_code"] == 137 and "signal SIGKILL" in first["evidence"]
            assert f"last line: simulated fault of node {BAD}" in first["evidence"]  # its log
            assert first["detect_s"] is not None and second["restart_s"] is not None
            json.dumps(result.restarts)  # flat, JSON-able records
            # The Job keeps the node out; `mnnvl status` says so.
            affinity = job_of(sim, run)["spec"]["template"]["spec"]["affinity"]
            assert BAD in json.dumps(affinity["nodeAffinity"])
            status = steps.status(run.domain, kubeconfig=sim.kubeconfig_path)
            assert [job["excluded_nodes"] for job in status.jobs] == [[BAD]]
            warned = [m for m in caplog.messages if m.startswith(f"node {BAD} is kept out")]
            assert len(warned) == 1 and "blamed for 2 failed attempts" in warned[0]
            for r in result.restarts:
                print(
                    f"k8s 1.{minor} restart {r['n']} ({r['how']}, excluded {r['excluded']}): "
                    f"detected after {r['detect_s']} s, every new pod Running {r['restart_s']} s "
                    "later"
                )
        finally:
            run.close()


@pytest.mark.slow
def test_a_node_excluded_with_no_spare_fails_at_once_naming_it_and_the_cordon(
    tmp_path: Path,
) -> None:
    with cluster(2) as sim:
        sim.faults.fail_node(BAD)
        run = Run(sim, tmp_path, max_restarts=3)
        try:
            started = time.monotonic()
            run.launch("gated")
            run.join()
            print(f"no spare node: failed {time.monotonic() - started:.1f} s after the launch")
            error = run.error
            assert isinstance(error, MnnvlError) and error.exit_code == 4, error
            text = str(error)
            assert f"node {BAD} was excluded after failing" in text
            assert f"kubectl cordon {BAD}" in text and "signal SIGKILL" in text
        finally:
            run.close()


@pytest.mark.slow
def test_nvlink_evidence_excludes_its_node_at_the_first_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="mnnvl")
    said = Evidence(
        reason="nvlink-errors",
        rank=2,
        gpu="1",
        exit_code=1,
        nvlink={"1": {"crc": 12, "replay": 3}},
        error="NCCL WARN NET/IB : remote peer closed the connection",
    )
    with cluster(2) as sim:
        sim.faults.fail_node(BAD, 1, said.to_message())
        run = Run(sim, tmp_path, max_restarts=3)
        try:
            run.launch("gated")
            run.join()
            error = run.error
            assert isinstance(error, MnnvlError) and error.exit_code == 4, error
            assert f"node {BAD} was excluded after failing" in str(error)
            assert "NVLink errors on GPU 1: crc +12, replay +3" in str(error)
            warned = [m for m in caplog.messages if m.startswith("attempt ")]
            assert len(warned) == 1  # excluded at its first failure
            assert f"(rank 2, GPU 1) on node {BAD}" in warned[0]
            assert any("hardware evidence" in m for m in caplog.messages)
        finally:
            run.close()


@pytest.mark.slow
def test_with_clique_groups_the_excluded_nodes_spare_comes_from_a_clique_of_its_own(
    tmp_path: Path,
) -> None:
    said = Evidence(reason="nvlink-errors", exit_code=1, nvlink={"0": {"replay": 5}})
    with cluster(6, cliques=2) as sim:  # two cliques of three nodes
        run = Run(sim, tmp_path, nodes=4, nodes_per_clique=2, max_restarts=3)
        try:
            run.launch("marked")
            jobs = [run.names.job("job", g) for g in (0, 1)]

            def placed() -> dict[str, str]:
                pods = Raw(sim).call(
                    "GET", "/api/v1/namespaces/default/pods", labelSelector=run.names.selector
                )["items"]
                running = [p for p in pods if p["status"].get("phase") == "Running"]
                return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in running}

            first = wait_for(lambda: len(placed()) == 4 and placed(), 120, "4 pods Running")
            bad = sorted(first.items())[0][1]  # a node of group 0's
            (tmp_path / f"{bad}.bad").write_text(said.to_message())

            def replaced() -> dict[str, str]:
                now = placed()
                return now if len(now) == 4 and not set(now) & set(first) else {}

            after = wait_for(replaced, 120, "the next attempt Running")
            run.gate.touch()
            run.join()
            assert run.error is None, run.error
            assert run.result.excluded_nodes == [bad]
            assert bad not in after.values()
            for job in jobs:  # each group still in one clique
                cliques = {sim.node_cliques[n] for p, n in after.items() if p.startswith(job)}
                assert len(cliques) == 1, after
            for job in jobs:
                spec = Raw(sim).get(f"/apis/batch/v1/namespaces/default/jobs/{job}")["spec"]
                assert bad in json.dumps(spec["template"]["spec"]["affinity"]["nodeAffinity"])
        finally:
            run.close()


@pytest.mark.slow
@pytest.mark.parametrize("says", [True, False], ids=["termination-message", "log-fallback"])
def test_each_failed_attempt_is_attributed_from_pod_status(
    tmp_path: Path, says: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="mnnvl")
    said = Evidence(rank=1, gpu="GPU-7a", exit_code=1, error="only in the message: disk full")
    # Pod failures only: restarts in place off, so that each attempt ends with a failed pod.
    env = {"MNNVL_IN_PLACE_RESTARTS": "0", **({"SAY": said.to_message()} if says else {})}
    with cluster(2) as sim:
        run = Run(sim, tmp_path, max_restarts=1, env=env)
        try:
            run.launch("failing")
            run.join()
            error = run.error
            assert isinstance(error, MnnvlError) and error.exit_code == 4, error
            warned = [m for m in caplog.messages if m.startswith("attempt 1 failed: ")]
            assert len(warned) == 1, caplog.messages
            line = warned[0]
            assert f"pod {run.job}-1-" in line and "on node sim-node-" in line
            assert "restarting every rank from the start (rank 0 has logged no checkpoint)" in line
            if says:  # the worker's evidence, which only its termination message carried
                assert "(rank 1, GPU GPU-7a)" in line
                assert "last line: only in the message: disk full" in line
            else:  # the kubelet's fallback: the log's last lines
                assert "(rank 1)" in line
                assert "last lines: " in line and "ValueError: batch 40 has no tokens | " in line
        finally:
            run.close()


@pytest.mark.slow
def test_the_same_error_at_the_same_step_on_another_node_stops_with_the_workers_words(
    tmp_path: Path,
) -> None:
    said = Evidence(rank=1, exit_code=1, step="40", error="ValueError: batch 40 has no tokens")
    with cluster(3) as sim:
        # One budget for both kinds of restart: each generation of pods restarts its workers
        # in place once before the same failure again recreates it (2 per node), and the
        # pods moved off the blamed node restart in place once more: 5 of 6.
        run = Run(sim, tmp_path, max_restarts=6, env={"SAY": said.to_message()})
        try:
            run.launch("failing")
            run.join()
            error = run.error
            assert isinstance(error, MnnvlError) and error.exit_code == 4, error
            text = str(error)
            assert "failed with the same error at step 40" in text
            assert "a restart cannot change it" in text
            assert "ValueError: batch 40 has no tokens" in text
        finally:
            run.close()


def job_body(name: str, suspend: bool) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "sim",
        "command": ["python3", "-c", "import time; time.sleep(60)"],
    }
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"suspend": suspend, "template": template},
    }


@pytest.mark.parametrize("minor", [36, 34])
def test_the_api_changes_a_jobs_node_affinity_only_while_the_job_is_suspended(minor: int) -> None:
    """As kube-apiserver's Job update validation: the pod template of a running Job is
    immutable; a suspended one may change its scheduling directives before it first started,
    and from 1.36 also after it ran, once its pods are gone."""
    affinity = {"spec": {"template": {"spec": {"affinity": without_node(None, BAD)}}}}
    path = "/apis/batch/v1/namespaces/default/jobs/{}"
    with cluster(2, kubernetes_minor=minor) as sim:
        raw = Raw(sim)
        raw.call("POST", "/apis/batch/v1/namespaces/default/jobs", job_body("queued", True))
        raw.call("PATCH", path.format("queued"), affinity)  # never started: allowed
        raw.call("POST", "/apis/batch/v1/namespaces/default/jobs", job_body("ran", False))
        wait_for(lambda: raw.get(path.format("ran")).get("status", {}).get("active"), 30, "a pod")
        with pytest.raises(ApiException) as running:
            raw.call("PATCH", path.format("ran"), affinity)
        assert running.value.status == 422 and "field is immutable" in str(running.value.body)
        raw.call("PATCH", path.format("ran"), {"spec": {"suspend": True}})

        def suspended() -> bool:
            status = raw.get(path.format("ran")).get("status", {})
            done = any(c["type"] == "Suspended" for c in status.get("conditions") or [])
            return done and not status.get("active")

        wait_for(suspended, 30, "the Job suspended with no active pod")
        if minor >= 36:
            changed = raw.call(
                "PATCH", path.format("ran"), {"spec": {**affinity["spec"], "suspend": False}}
            )
            assert BAD in json.dumps(changed["spec"]["template"]["spec"]["affinity"])
        else:
            with pytest.raises(ApiException) as ran:
                raw.call("PATCH", path.format("ran"), affinity)
            assert ran.value.status == 422
        for name in ("queued", "ran"):
            raw.call("DELETE", path.format(name), {"propagationPolicy": "Background"})

"""The pod's launcher classifies its workers' failures and leaves its evidence as the
container's termination message (real processes, CPU; NVML faked by a ``pynvml`` module)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mnnvl.contract import exit_codes
from mnnvl.contract.env import GPUS_PER_NODE
from mnnvl.contract.termination import STOP, TERMINATION_PATH_ENV, Evidence, parse
from mnnvl.runtime import evidence

ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from mnnvl.runtime.progress import report
    rank, mode = int(os.environ["RANK"]), sys.argv[1]
    report("step 7", 0)
    if rank == 1 and mode == "raise":
        raise RuntimeError("boom in rank 1")
    if rank == 0 and mode == "oom":
        import logging
        logging.getLogger("train").error("CUDA out of memory: lower --batch-size")
        sys.exit(10)
    if rank == 1 and mode == "nvlink":
        reads = os.environ["NVML_READS"]
        while not os.path.exists(reads):  # the launcher has read the counters at its start
            time.sleep(0.05)
        with open(os.environ["NVML_COUNTERS"], "w") as f:
            f.write('{"2": 5, "0": 3, "xid": 74}')  # CRC (flit), replay errors, NVLink Xid
        sys.exit(1)
    time.sleep(300)
    """
)
# A ``pynvml`` for the launcher: the fake NVML's two H200s, GPU 1's NVLink error counters
# read from $NVML_COUNTERS; each shutdown (a finished read) touches $NVML_READS.
PYNVML = textwrap.dedent(
    """
    import json, os
    from tests.unit.fake_pynvml import FakeNvml, h200
    _gpus = [h200("GPU-0"), h200("GPU-1")]
    _fake = FakeNvml(_gpus)

    def nvmlShutdown():
        open(os.environ["NVML_READS"], "a").close()

    def __getattr__(name):
        try:
            with open(os.environ["NVML_COUNTERS"]) as f:
                found = json.load(f)
        except FileNotFoundError:
            return getattr(_fake, name)
        xid = found.pop("xid", None)
        if xid is not None and not _gpus[1].errors:
            _gpus[1].xids.append(xid)  # once, when the counters first rise
        _gpus[1].errors = {int(k): v for k, v in found.items()}
        return getattr(_fake, name)
    """
)


def launch(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    (tmp_path / "evidence_worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "mnnvl.runtime.launch", *argv]
    done = subprocess.run(
        cmd,
        env={
            "PYTHONPATH": f"{tmp_path}:{ROOT}",
            "PATH": "/usr/bin:/bin",
            TERMINATION_PATH_ENV: str(tmp_path / "termination-log"),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stderr


def message(tmp_path: Path):  # type: ignore[no-untyped-def]
    evidence = parse((tmp_path / "termination-log").read_text())
    assert evidence is not None
    return evidence


def test_a_module_not_in_the_image_exits_13_not_retried_with_its_words(tmp_path):
    code, err = launch(tmp_path, "--nproc-per-node=2", "-m", "no.such.module")
    assert code == exit_codes.MODULE_NOT_FOUND, err[-2000:]
    assert code in exit_codes.NON_RETRIABLE_EXIT_CODES
    assert "cannot run module 'no.such.module': No module named 'no'; check --module" in err
    evidence = message(tmp_path)
    assert (evidence.verdict, evidence.reason, evidence.exit_code) == (
        STOP,
        "module-not-found",
        exit_codes.MODULE_NOT_FOUND,
    )
    assert "No module named 'no'" in evidence.error


def test_an_import_inside_the_module_that_fails_is_the_modules_crash_retried(tmp_path):
    (tmp_path / "imports_a_missing_dependency.py").write_text("import no_such_dependency\n")
    code, err = launch(tmp_path, "-m", "imports_a_missing_dependency")
    assert code == exit_codes.UNEXPECTED, err[-2000:]
    evidence = message(tmp_path)
    assert evidence.verdict == "retry" and evidence.reason == "crashed"
    assert "No module named 'no_such_dependency'" in evidence.error


def test_a_clique_groups_missing_program_exits_127_not_2(tmp_path):
    code, err = launch(tmp_path, "--exec", "--", "nosuchprogram", "--flag")
    assert code == exit_codes.PROGRAM_NOT_FOUND, err[-2000:]
    assert "cannot run 'nosuchprogram' in this image" in err
    evidence = message(tmp_path)
    assert (evidence.verdict, evidence.reason) == (STOP, "program-not-found")


def test_the_first_failed_worker_is_named_with_its_step_and_its_last_lines(tmp_path):
    code, _ = launch(tmp_path, "--nproc-per-node=2", "-m", "evidence_worker", "raise")
    assert code == 1
    evidence = message(tmp_path)
    assert (evidence.rank, evidence.local_rank, evidence.exit_code) == (1, 1, 1)
    assert evidence.step == "step 7" and evidence.verdict == "retry"
    assert evidence.error.rstrip().endswith("RuntimeError: boom in rank 1")
    assert not evidence.hardware  # a CPU pod: no NVML evidence


def test_nvlink_errors_rising_on_one_gpu_are_the_pods_hardware_evidence(tmp_path):
    (tmp_path / "pynvml.py").write_text(PYNVML)
    env = {
        GPUS_PER_NODE: "2",
        "NVML_COUNTERS": str(tmp_path / "counters.json"),
        "NVML_READS": str(tmp_path / "nvml-reads"),
    }
    code, err = launch(tmp_path, "--nproc-per-node=2", "-m", "evidence_worker", "nvlink", env=env)
    assert code == 1, err[-2000:]
    evidence = message(tmp_path)
    assert evidence.rank == 1 and evidence.gpu == "1"
    assert evidence.nvlink == {"1": {"crc": 5 * 18, "replay": 3 * 18}}  # 18 links each
    assert evidence.xid == [["1", 74]] and evidence.hardware


def test_a_termination_message_that_cannot_be_written_changes_no_exit_code(tmp_path):
    blocked = tmp_path / "no-such-dir" / "termination-log"
    code, err = launch(tmp_path, "-m", "no.such.module", env={TERMINATION_PATH_ENV: str(blocked)})
    assert code == exit_codes.MODULE_NOT_FOUND
    assert f"could not write the failure's evidence to {blocked}" in err


def test_a_worker_that_exits_by_itself_leaves_its_last_error_lines(tmp_path):
    code, err = launch(tmp_path, "--nproc-per-node=2", "-m", "evidence_worker", "oom")
    assert code == exit_codes.OUT_OF_MEMORY, err[-2000:]
    evidence = message(tmp_path)
    assert (evidence.rank, evidence.verdict, evidence.reason) == (0, STOP, "out-of-memory")
    assert evidence.error == "CUDA out of memory: lower --batch-size"


def test_a_workers_own_evidence_is_kept_and_completed_by_the_launcher(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    own = Evidence(gpu="GPU-7a", error="disk full", nvlink={"0": {"crc": 2}})
    path.write_text(own.to_message())
    evidence.write(
        Evidence(rank=1, exit_code=1, step="40", error="launcher's view"),
        {TERMINATION_PATH_ENV: str(path)},
    )
    said = parse(path.read_text())
    assert said is not None
    assert (said.rank, said.exit_code, said.step) == (1, 1, "40")
    assert (said.gpu, said.error, said.nvlink) == ("GPU-7a", "disk full", {"0": {"crc": 2}})

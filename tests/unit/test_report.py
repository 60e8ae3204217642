"""Report files from RESULT dicts: contents a reader relies on, and a real embedded PNG."""

from __future__ import annotations

import base64
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from mnnvl import report, report_train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def verify_result(verdict: str = "PASS") -> dict[str, Any]:
    return {
        "kind": "verify",
        "verdict": verdict,
        "reasons": ["busbw 27.0 GB/s is below the derived threshold 296.4 GB/s"]
        if verdict == "FAIL"
        else [],
        "threshold_gbps": 296.432,
        "threshold_source": "derived",
        "judged_busbw_gbps": 339.1,
        "peak_busbw_gbps": 339.1,
        "world_size": 2,
        "backend": "nccl",
        "nccl": {"version": "2.28.9", "transport": "NVLink P2P", "mnnvl": False},
        "sizes": [
            {
                "bytes": 1 << 20,
                "time_us": 29.9,
                "algbw_gbps": 35.1,
                "busbw_gbps": 35.1,
                "correct": True,
            },
            {
                "bytes": 4 << 30,
                "time_us": 12665.6,
                "algbw_gbps": 339.1,
                "busbw_gbps": 339.1,
                "correct": True,
            },
        ],
        "topology": {
            "gpus_per_rank": 1,
            "active_links": 18,
            "link_speed_gbps": 26.562,
            "link_limit_gbps": 478.116,
            "nvlink_version": 4,
            "fabric": None,
        },
        "nodes": [],
        "wall_s": 12.5,
    }


def test_verify_report_writes_all_five_files(tmp_path: Path) -> None:
    files = report.write_verify_report(verify_result(), str(tmp_path / "out"))
    assert set(files) == {"json", "markdown", "ctrf", "png", "html"}
    assert json.loads(Path(files["json"]).read_text())["verdict"] == "PASS"
    assert Path(files["png"]).read_bytes().startswith(PNG_MAGIC)


def test_markdown_has_the_size_table_threshold_and_reasons(tmp_path: Path) -> None:
    files = report.write_verify_report(verify_result("FAIL"), str(tmp_path))
    md = Path(files["markdown"]).read_text()
    assert "| size | time µs | algbw GB/s | busbw GB/s | correct |" in md
    assert "| 4 GiB | 12665.60 | 339.10 | 339.10 | yes |" in md
    assert "threshold: 296.4 GB/s (derived)" in md
    assert "NVLink verification: FAIL" in md
    assert "- busbw 27.0 GB/s is below the derived threshold" in md


def test_html_embeds_the_png_itself(tmp_path: Path) -> None:
    files = report.write_verify_report(verify_result(), str(tmp_path))
    page = Path(files["html"]).read_text()
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert match is not None
    assert base64.b64decode(match.group(1)) == Path(files["png"]).read_bytes()


def test_verify_table_for_terminals() -> None:
    table = report.verify_table(verify_result())
    assert "1 MiB" in table and "4 GiB" in table and "verdict: PASS" in table
    no_threshold = {**verify_result(), "threshold_gbps": None, "threshold_source": "none"}
    assert "threshold: none (bandwidth not judged)" in report.verify_table(no_threshold)


def test_transport_and_nccl_version_lead_the_table_and_the_markdown(tmp_path: Path) -> None:
    first = report.verify_table(verify_result()).splitlines()[:4]
    assert first[0] == "verdict: PASS"
    assert first[3] == "transport: NCCL 2.28.9 over NVLink P2P"
    report.write_verify_report(verify_result(), str(tmp_path))
    head = (tmp_path / "verify.md").read_text().splitlines()[:6]
    assert head[2] == "**verdict: PASS; failed checks: none**"
    assert head[5] == "- transport: NCCL 2.28.9 over NVLink P2P"
    gloo = {**verify_result("NOT_JUDGED"), "backend": "gloo", "nccl": None}
    assert "gloo on CPU (no NCCL, no NVLink)" in report.verify_table(gloo).splitlines()[3]


def test_report_works_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    files = report.write_verify_report(verify_result(), str(tmp_path))
    assert "png" not in files and Path(files["html"]).exists()


def test_train_report(tmp_path: Path) -> None:
    result = {
        "kind": "train",
        "model": "tiny",
        "final_loss": 2.5,
        "tokens_per_s": 1000.0,
        "mfu": None,
        "steps": 20,
        "compile": True,
        "compile_input": "auto",
        "checkpoint_stall_s": {"last": 0.021, "max": 0.43, "saves": 3},
        "checkpoint_final_wait_s": 12.4,
        "start_step": 10,
        "resume_source": "host",
        "resume_load_s": 1.5,
        "losses": [[0, 10.0], [10, 5.0], [20, 2.5]],
    }
    files = report_train.write_train_report(result, str(tmp_path))
    assert set(files) == {"json", "markdown", "png", "html"}
    assert Path(files["png"]).read_bytes().startswith(PNG_MAGIC)
    markdown = Path(files["markdown"]).read_text()
    assert "| final_loss | 2.5000 |" in markdown
    assert "| compile | True (--compile auto) |" in markdown
    # Where a restart loaded its checkpoint from (the pods' memory or the disk), and how long.
    assert "| resume_source | host |\n| resume_load_s | 1.5000 |" in markdown
    assert (
        "| checkpoint_stall_s | last 0.021, max 0.430 (3 saves); the last write waited for "
        "12.400 s |" in markdown
    )


def test_result_schema_names_what_a_result_lacks() -> None:
    from mnnvl.contract.result import schema_problems

    assert schema_problems({"kind": "custom", "anything": 1}) == []
    problems = schema_problems(
        {"kind": "verify", "verdict": "MAYBE", "sizes": [{"bytes": 1}], "world_size": 2}
    )
    assert "missing threshold_gbps" in problems
    assert any("verdict 'MAYBE'" in p for p in problems)
    assert "sizes[0] missing busbw_gbps" in problems


def test_numbers_in_logs_are_rounded_and_missing_ones_say_so():
    from mnnvl.report import num

    assert num(2653.522360730127, 0) == "2654"
    assert num(0.123456, 3) == "0.123"
    assert num(None) == "n/a"
    assert num(20) == "20"


def test_verdict_numbers_say_when_there_is_no_threshold_and_keep_small_figures():
    unjudged = {"judged_busbw_gbps": 0.000421, "peak_busbw_gbps": 0.0009, "threshold_gbps": None}
    words = report.verdict_numbers(unjudged)
    assert "n/a" not in words and "None" not in words
    assert "no threshold (bandwidth not judged)" in words and "0.000421 GB/s" in words
    judged = {"judged_busbw_gbps": 346.71, "threshold_gbps": 296.4, "threshold_source": "derived"}
    assert report.verdict_numbers(judged).startswith(
        "judged busbw 346.7 GB/s vs threshold 296.4 GB/s (derived)"
    )


def test_a_small_user_threshold_prints_as_given_in_the_table_and_the_markdown(tmp_path: Path):
    cpu = {**verify_result(), "threshold_gbps": 0.001, "threshold_source": "user"}
    cpu["judged_busbw_gbps"] = 0.0042
    table = report.verify_table(cpu)
    assert "threshold 0.001 GB/s" in table and "threshold: 0.001 GB/s (user)" in table
    assert "busbw 0.0042 GB/s" in table and "0.0 GB/s" not in table
    files = report.write_verify_report(cpu, str(tmp_path))
    assert "threshold: 0.001 GB/s" in Path(files["markdown"]).read_text()


class _Page(HTMLParser):
    """The tags of a page in order, and its visible text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_verify_html_is_a_page_with_the_verdict_first_and_real_tables(tmp_path: Path) -> None:
    result = verify_result("FAIL")
    result["reasons"] = ["busbw <27 GB/s> is below the threshold"]
    result["checks"] = [{"name": "bandwidth", "status": "FAIL", "messages": ["too slow"]}]
    files = report.write_verify_report(result, str(tmp_path))
    page = _Page(Path(files["html"]).read_text())
    text = "".join(page.text)
    # The verdict comes before the plot and the tables; tables are tables, not Markdown.
    assert page.tags.index("p") < page.tags.index("img") < page.tags.index("table")
    assert (
        page.tags.count("table") == 2 and "<th>busbw GB/s</th>" in Path(files["html"]).read_text()
    )
    assert "verdict: FAIL; failed checks: bandwidth" in text
    assert "**" not in text and "| size |" not in text and "null" not in text
    assert "fabric: not reported" in text
    assert "busbw <27 GB/s> is below" in text  # escaped in the source, read back as written
    assert "<pre>" not in Path(files["html"]).read_text()


def test_key_figure_files_are_lines(tmp_path: Path) -> None:
    report.write_verify_report(verify_result(), str(tmp_path))
    both = (tmp_path / "verdict.txt").read_text() + (tmp_path / "threshold_source.txt").read_text()
    assert both == "PASS\nderived\n"  # `cat verdict.txt threshold_source.txt`


FULL_FAULT = {
    "n": 1,
    "at": 1764770000.0,
    "how": "killed",
    "pod": "job-1-abcde",
    "node": "node-3",
    "rank": 1,
    "gpu": 2,
    "exit_code": 137,
    "reason": "Error",
    "evidence": {"nvlink_replay": 12},
    "excluded": True,
    "detect_s": 1.25,
    "restart_s": 4.0,
    "recovery_s": 11.5,
    "steps_lost": 7,
}


def test_a_restart_shows_every_key_it_has_and_a_dash_for_the_rest(tmp_path: Path) -> None:
    today = {"pod": "job-1-abcde", "exit_code": 137, "steps_lost": 3, "recovery_s": 9.25}
    line = report_train.fault_line(today, 1)
    assert line.startswith("restart 1 at —: pod job-1-abcde on node — (rank —, GPU —) exit code")
    assert "detected after — s, gang restarted after — s, first resumed step after 9.2 s" in line
    # A TrainJob's runtime restarted it: the count alone, no row of dashes.
    by_runtime = report_train.fault_line({"runtime": "TrainJob"}, 2)
    assert by_runtime == "restart 2: by the TrainJob's runtime (its cost is in the goodput)"
    full = report_train.fault_line(FULL_FAULT, 1)
    assert "restart 1 at 2025-12-03 13:53:20: killed pod job-1-abcde on node node-3" in full
    assert (
        "(rank 1, GPU 2) exit code 137 (Error); evidence: nvlink_replay: 12; its node kept out"
        in full
    )
    assert (
        "detected after 1.2 s, gang restarted after 4.0 s, first resumed step after 11.5 s" in full
    )
    result = {"steps": 10, "faults": [today, FULL_FAULT], "goodput": 0.42, "losses": []}
    md = Path(report_train.write_train_report(result, str(tmp_path))["markdown"]).read_text()
    assert "goodput 42% of the train step's wall time; 2 restarts, steps redone: 10" in md
    assert "| 1 | — | — | job-1-abcde | — | — | — | 137 | — | — | — |" in md
    assert "| 1 | 2025-12-03 13:53:20 | killed | job-1-abcde | node-3 | 1 | 2 | 137 |" in md


def test_goodput_is_productive_time_over_the_steps_wall_time() -> None:
    raw = {"steps": 100, "batch_size": 4, "seq_len": 256, "world_size": 2, "tokens_per_s": 2048}
    assert report_train.goodput(raw, 200.0) == 0.5  # 100 steps x 2048 tokens at 2048/s
    assert report_train.goodput({**raw, "tokens_per_s": None}, 200.0) is None
    # Steps slowed beside a background save are not productive either.
    assert report_train.goodput({**raw, "checkpoint_lost_s": 20.0}, 200.0) == 0.4


def test_kueues_evictions_show_beside_the_restarts_in_the_report_and_the_run_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mnnvl import run

    result = {"steps": 10, "faults": [], "evictions": 1, "goodput": 0.5, "losses": []}
    md = Path(report_train.write_train_report(result, str(tmp_path))["markdown"]).read_text()
    assert "goodput 50% of the train step's wall time; 0 restarts, 1 eviction by Kueue" in md
    assert "1 eviction by Kueue: its pods were deleted and it queued again" in md
    assert "none: every rank ran start to end" not in md
    assert "eviction" not in report_train.goodput_line({**result, "evictions": 0})

    train = {**result, "final_loss": 4.2, "tokens_per_s": 900.0, "evictions": 3}
    with caplog.at_level("INFO", logger="mnnvl.run"):
        run._log_summary({"run_id": "r", "train": train})
    assert "0 restarts, 3 evictions by Kueue, steps redone: 0" in caplog.text

"""A hung API server (it accepts connections and never answers) is reported within about one
report interval, not only after a minute-long read timeout."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from mnnvl.driver import Api
from mnnvl.driver.api import POD, REQUEST_TIMEOUT_S
from mnnvl.driver.retry import OUTAGE_REPORT_EVERY_S
from mnnvl.errors import MnnvlError

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: hung, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: hung, context: {{cluster: hung, user: u}}}}]
current-context: hung
"""
# The kubernetes client's own code paths: make test-client-newest runs them with its newest.
pytestmark = pytest.mark.client


def test_a_hung_api_server_is_reported_within_one_report_interval(tmp_path: Path, caplog):
    caplog.set_level(logging.WARNING, logger="mnnvl")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes connections; nothing ever reads or answers
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(port=silent.getsockname()[1]))
    errors: list[BaseException] = []

    def get() -> None:
        # Tolerating a minute: long enough for the report, short enough that the thread ends soon.
        with Api.connect(str(kubeconfig), outage_s=60) as api:
            try:
                api.get(POD, "default", "p")
            except MnnvlError as e:
                errors.append(e)

    threading.Thread(target=get, daemon=True).start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < REQUEST_TIMEOUT_S + OUTAGE_REPORT_EVERY_S + 20:
            lines = [m for m in caplog.messages if "API unreachable for" in m]
            if lines:
                break
            time.sleep(0.2)
    finally:
        silent.close()
    assert lines, "no progress line while the API server stayed silent"
    # The line comes when the first request times out, and counts from when it was sent.
    assert time.monotonic() - started < REQUEST_TIMEOUT_S + 10
    assert int(lines[0].split("for ")[1].split(" s")[0]) >= REQUEST_TIMEOUT_S - 1
    assert not errors

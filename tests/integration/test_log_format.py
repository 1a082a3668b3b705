"""``--log-format json`` and the warning for ``CLUSTER_*`` variables that are no setting
(issue 35): a real single-member ``python -m cluster.node`` started, stopped with SIGTERM,
and every line of its stderr parsed; and a SIGTERM in the middle of its start-up."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from cluster.launch import JsonFormatter, unknown_variables
from cluster.local import free_ports, wait_for_port


def run_node(
    tmp_path: Path,
    env: dict[str, str],
    *,
    service: str = "cluster.examples.echo:EchoService",
    started: Callable[[], bool] | None = None,
) -> list[str]:
    """Start a member alone, wait until ``started()`` says so (by default: until its
    ingress port listens), stop it with SIGTERM; its stderr lines, once it exited with 0."""
    ports = free_ports(3)
    members = f"0=127.0.0.1:{ports[0]}:{ports[1]}:{ports[2]}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_")}
    command = [sys.executable, "-m", "cluster.node", "--member-id", "0", "--members", members]
    command += ["--dir", str(tmp_path / "data"), "--service", service]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, **env},
    )
    try:
        if started is None:
            assert wait_for_port("127.0.0.1", ports[0], 20)
        else:
            deadline = time.monotonic() + 20
            while not started():
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the member did not get there"
                time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return err.splitlines()


def test_json_log_lines_and_a_warning_for_each_unknown_variable(tmp_path: Path) -> None:
    lines = run_node(
        tmp_path,
        {
            "CLUSTER_LOG_FORMAT": "json",  # the setting, from the environment
            "CLUSTER_SESION_TIMEOUT": "5s",  # misspelt
            "CLUSTER_BOGUS": "1",
            "CLUSTER_SECRETS_FILE": "/nonexistent",  # read by the example authenticator
        },
    )
    records = [json.loads(line) for line in lines]  # every line is one object
    assert len(records) >= 3
    for r in records:
        assert {"time", "level", "logger", "member", "message"} <= set(r)
        assert r["member"] == 0
        assert r["time"].endswith("Z")
        datetime.fromisoformat(r["time"].replace("Z", "+00:00"))
    warnings = [r for r in records if r["level"] == "WARNING" and "environment" in r["message"]]
    assert sorted(r["message"].split()[2] for r in warnings) == [
        "CLUSTER_BOGUS",
        "CLUSTER_SESION_TIMEOUT",
    ]
    assert {r["logger"] for r in warnings} == {"cluster.node"}
    starting = [r for r in records if r["message"].startswith("starting member 0")]
    assert len(starting) == 1
    assert "log-format = json" in starting[0]["message"]  # one object, newlines and all
    assert any("SIGTERM" in r["message"] for r in records)


def test_text_is_the_default_and_knows_no_warning_for_settings(tmp_path: Path) -> None:
    lines = run_node(tmp_path, {"CLUSTER_SESSION_TIMEOUT": "5s"})
    assert not any(line.startswith("{") for line in lines)
    assert any(" INFO cluster.node: starting member 0" in line for line in lines)
    assert not any("environment variable" in line for line in lines)


def test_an_exception_is_one_field_of_its_line() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.getLogger("cluster.x").makeRecord(
            "cluster.x", logging.ERROR, __file__, 1, "failed: %s", ("it",), sys.exc_info()
        )
    line = JsonFormatter(2).format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed: it"
    assert parsed["member"] == 2
    assert parsed["level"] == "ERROR"
    assert parsed["exception"].startswith("Traceback")
    assert "ValueError: bad" in parsed["exception"]


def test_unknown_variables_are_only_cluster_ones_that_name_no_setting() -> None:
    environ = {
        "CLUSTER_MEMBERS": "x",
        "CLUSTER_LOG_FORMAT": "json",
        "CLUSTER_CONFIG": "a.toml",
        "CLUSTER_MEMBER": "0",
        "HOME": "/",
        "MY_CLUSTER_X": "1",
    }
    assert unknown_variables(environ) == ["CLUSTER_MEMBER"]


SLOW_START = """
import os
import time
from pathlib import Path

from cluster.examples.echo import EchoService


class SlowStart(EchoService):
    def on_start(self, cluster, snapshot):
        Path(os.environ["SLOW_START_MARKER"]).touch()
        time.sleep(2)  # the event loop held: the signal waits for it
        super().on_start(cluster, snapshot)
"""


def test_sigterm_in_the_middle_of_start_up_stops_the_member_as_later(tmp_path: Path) -> None:
    """A SIGTERM while the member recovers (its service's ``on_start`` running, before
    any agent): it stops as a running one does, exit code 0 and the signal logged, not
    killed by the signal's default action (-15, before the signal was the node's from
    its first instant)."""
    (tmp_path / "slow_start.py").write_text(textwrap.dedent(SLOW_START))
    marker = tmp_path / "on_start"
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    lines = run_node(
        tmp_path,
        {"PYTHONPATH": path, "SLOW_START_MARKER": str(marker)},
        service="slow_start:SlowStart",
        started=marker.exists,
    )
    assert any("received SIGTERM: shutting down" in line for line in lines)

"""Truthful health (issue 31), with real node processes and the tool as an operator runs
it: a lone member (the others not started) is unhealthy, "no leader"; the full cluster is
healthy (``cluster-tool health`` exit 0, every ``/health`` 200); SUSPENDED, it is not
(exit 1, reason "suspended", ``/health`` 503); resumed, healthy again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.local import LocalCluster, free_ports

pytestmark = pytest.mark.slow

# generous: a busy 2-core machine must not see a healthy leader lose its quorum
NODE_ARGS = [
    "--leader-heartbeat-timeout", "3s", "--leader-heartbeat-interval", "100ms",
]  # fmt: skip
WAIT = 90.0


def get_health(port: int) -> tuple[int, dict[str, Any]] | None:
    """``GET /health``: the code and the JSON body (None while the port is not served)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def tool_health(cluster: LocalCluster) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "--timeout", "5s",
         "--json", "health"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1), (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.returncode, json.loads(result.stdout)


def tool_action(cluster: LocalCluster, action: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, "--timeout", "5s",
         action],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout, result.stderr)


def wait_until(probe: Callable[[], Any], good: Callable[[Any], bool], what: str) -> Any:
    """Call ``probe`` until ``good`` holds of its value (at most :data:`WAIT` seconds)."""
    deadline = time.monotonic() + WAIT
    while True:
        value = probe()
        if good(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT}s waiting for {what}; last: {value}")
        time.sleep(0.2)


def test_health_alone_healthy_suspended_and_resumed(tmp_path: Path) -> None:
    ports = free_ports(3)
    cluster = LocalCluster(3, "cluster.examples.echo:EchoService", tmp_path)
    try:
        # ------------------------------------------------------------ a lone member
        cluster.extra_args = [*NODE_ARGS, "--metrics-port", str(ports[0])]
        cluster.start(0)
        code, body = wait_until(
            lambda: get_health(ports[0]), lambda r: r is not None, "member 0's /health"
        )
        assert code == 503, body
        assert body["health"] is False
        assert any(r.startswith("no leader") for r in body["reasons"]), body
        code, doc = tool_health(cluster)
        assert code == 1, doc
        assert doc["healthy"] is False
        assert doc["reason"] == "no leader", doc
        assert doc["leader_member_id"] == -1
        alone = doc["members"][0]
        assert alone["reachable"] is True
        assert alone["healthy"] is False
        assert any(r.startswith("no leader") for r in alone["reasons"]), alone
        assert [m["reachable"] for m in doc["members"][1:]] == [False, False]
        assert doc["problems"][-1] == "no leader"

        # ------------------------------------------------------------ the whole cluster
        for member in (1, 2):
            cluster.extra_args = [*NODE_ARGS, "--metrics-port", str(ports[member])]
            cluster.start(member)
        code, doc = wait_until(
            lambda: tool_health(cluster), lambda r: r[0] == 0, "cluster-tool health exit 0"
        )
        assert (doc["healthy"], doc["reason"], doc["problems"]) == (True, "healthy", [])
        leader = doc["leader_member_id"]
        assert leader >= 0
        assert doc["members"][leader]["reasons"] == ["leader"]
        for member, port in enumerate(ports):
            code, body = wait_until(
                lambda p=port: get_health(p),  # type: ignore[misc]
                lambda r: r is not None and r[0] == 200,
                f"member {member}'s /health 200",
            )
            assert body["health"] is True
            assert body["reason"] == ("leader" if member == leader else f"follows leader {leader}")

        # ------------------------------------------------------------ SUSPENDED
        tool_action(cluster, "suspend")
        code, doc = wait_until(
            lambda: tool_health(cluster),
            lambda r: all(m["reasons"] == ["suspended"] for m in r[1]["members"]),
            "every member suspended",
        )
        assert code == 1
        assert doc["healthy"] is False
        assert doc["reason"] == "suspended"
        assert doc["problems"] == [f"member {i}: suspended" for i in range(3)]
        for port in ports:
            result = get_health(port)
            assert result is not None
            code, body = result
            assert code == 503, body
            assert (body["health"], body["reason"]) == (False, "suspended")
            assert body["module_state"] == "SUSPENDED"

        # ------------------------------------------------------------ resumed
        tool_action(cluster, "resume")
        code, doc = wait_until(
            lambda: tool_health(cluster), lambda r: r[0] == 0, "cluster-tool health exit 0"
        )
        assert doc["healthy"] is True
        for port in ports:
            wait_until(
                lambda p=port: get_health(p),  # type: ignore[misc]
                lambda r: r is not None and r[0] == 200,
                "/health 200 after resume",
            )
    finally:
        cluster.stop_all()

"""`--metrics-port` (issue #21): `/metrics` scraped and parsed as Prometheus does;
`/health` and `cluster-tool health` with every member up and with two killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import client
from cluster import __version__
from cluster.local import LocalCluster, free_ports


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(predicate, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def tool(members: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", members, "--json", command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def tool_health(members: str) -> subprocess.CompletedProcess[str]:
    return tool(members, "health")


def echo(endpoints: str, count: int) -> None:
    async def run() -> None:
        async with client.connect(endpoints, connect_timeout=20) as c:
            with trio.fail_after(30):
                for i in range(count):
                    await c.offer(b"m%d" % i)
                    assert await c.receive() == b"m%d" % i

    trio.run(run)


def histogram_count(families: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    """The ``_count`` sample of histogram ``name`` with ``labels``; its buckets are checked
    to be cumulative and to end in ``+Inf`` equal to the count."""
    samples = [s for s in families[name].samples if labels.items() <= s.labels.items()]
    (count,) = [s.value for s in samples if s.name == name + "_count"]
    buckets = [s for s in samples if s.name == name + "_bucket"]
    assert buckets[-1].labels["le"] == "+Inf"
    assert buckets[-1].value == count
    values = [b.value for b in buckets]
    assert values == sorted(values)
    return count


def healthy(port: int) -> bool:
    try:
        return get(port, "/health")[0] == 200
    except OSError:
        return False


@pytest.mark.slow
def test_metrics_and_health_through_a_lost_quorum(tmp_path: Path) -> None:
    ports = free_ports(3)
    cluster = LocalCluster(3, "cluster.examples.echo:EchoService", tmp_path)
    fast = ["--leader-heartbeat-timeout", "1s", "--leader-heartbeat-interval", "100ms"]
    try:
        for member, port in enumerate(ports):
            cluster.extra_args = [*fast, "--metrics-port", str(port)]
            cluster.start(member)
        wait_for(lambda: all(healthy(p) for p in ports))
        echo(cluster.ingress_endpoints, 200)
        time.sleep(0.5)  # a few slow ticks: replication lag sampled
        leader = None
        for member, port in enumerate(ports):
            status, body = get(port, "/metrics")
            assert status == 200
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            assert {
                "triarch_role",
                "triarch_leadership_term",
                "triarch_log_position_bytes",
                "triarch_elections",  # counters: the parser drops `_total`
                "triarch_snapshots",
                "triarch_disk_full",
                "triarch_sessions",
                "triarch_kept_reply_bytes",
                "triarch_queries",
                "triarch_read_rounds",
            } <= set(families)
            assert families["triarch_elections"].type == "counter"
            (info,) = families["triarch_build_info"].samples
            assert info.labels["version"] == __version__
            (changes,) = families["triarch_leader_changes"].samples
            assert changes.value >= 1
            (archived,) = families["triarch_archive_bytes"].samples
            assert archived.value > 200 * 16
            # every member syncs its archive and turns its duty cycle
            assert families["triarch_fsync_duration_seconds"].type == "histogram"
            assert histogram_count(families, "triarch_fsync_duration_seconds") > 0
            assert histogram_count(families, "triarch_duty_cycle_duration_seconds") > 0
            histogram_count(families, "triarch_loop_stall_seconds")  # the stall finder's
            kinds = {s.labels["kind"] for s in families["triarch_loop_stalls"].samples}
            assert kinds == {"busy", "late"}
            (is_leader,) = families["triarch_is_leader"].samples
            assert is_leader.labels == {"member": str(member)}
            if is_leader.value == 1:
                leader = member
                lags = families["triarch_follower_lag_bytes"].samples
                assert sorted(s.labels["follower"] for s in lags) == sorted(
                    str(m) for m in range(3) if m != member
                )
                # one value per duty cycle that published, at least one per round trip
                assert histogram_count(families, "triarch_commit_latency_seconds") >= 100
                for m in range(3):
                    if m != member:
                        name = "triarch_replication_lag_seconds"
                        assert histogram_count(families, name, follower=str(m)) > 0
            health = json.loads(get(port, "/health")[1])
            assert health["health"] is True
        assert leader is not None
        assert get(ports[leader], "/nowhere")[0] == 404
        # the same histograms through cluster-tool
        timings = json.loads(tool(cluster.members, "timings").stdout)["members"]
        assert all(m["fsync"]["count"] > 0 and m["duty_cycle"]["count"] > 0 for m in timings)
        assert timings[leader]["commit"]["count"] >= 100
        assert len(timings[leader]["replication"]) == 2
        stalls = json.loads(tool(cluster.members, "stalls").stdout)["members"]
        assert [m["threshold_s"] for m in stalls] == [0.005] * 3
        up = tool_health(cluster.members)
        assert up.returncode == 0, up.stdout + up.stderr
        assert json.loads(up.stdout)["healthy"] is True
        for member in range(3):
            if member != leader:
                cluster.kill(member)
        down = tool_health(cluster.members)
        assert down.returncode == 1
        report = json.loads(down.stdout)
        assert report["healthy"] is False
        assert any("down" in p for p in report["problems"]), report
        wait_for(lambda: get(ports[leader], "/health")[0] == 503)
        health = json.loads(get(ports[leader], "/health")[1])
        assert health["health"] is False
        assert "quorum" in health["reason"] or "leader" in health["reason"]
    finally:
        cluster.stop_all()

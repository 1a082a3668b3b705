"""A real Prometheus (where the `prometheus` binary is installed: `apt install
prometheus`) scrapes a 3-member cluster with docs/monitoring's alert rules loaded:
every member's target is up, the queries the dashboard makes return data, and killing a
member raises TriarchMemberDown (pending: the rule waits a minute before it fires)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_metrics_http import echo

from cluster.local import LocalCluster, free_ports

RULES = Path(__file__).resolve().parents[2] / "docs" / "monitoring" / "triarch-alerts.yml"
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed"),
]


def query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def wait_for(predicate, seconds: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_prometheus_scrapes_the_cluster_and_alerts_on_a_member_down(tmp_path: Path) -> None:
    metrics = free_ports(3)
    (web,) = free_ports(1)
    cluster = LocalCluster(3, "cluster.examples.echo:EchoService", tmp_path / "cluster")
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f'"127.0.0.1:{p}"' for p in metrics)
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: triarch\n    static_configs: [{{targets: [{targets}]}}]\n"
    )
    assert PROMETHEUS is not None
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        for member, port in enumerate(metrics):
            cluster.extra_args = ["--metrics-port", str(port)]
            cluster.start(member)
        wait_for(lambda: len(query(web, "triarch_is_leader == 1")) == 1)
        echo(cluster.ingress_endpoints, 300)
        # every target scraped (each has its own offset within the scrape interval)
        wait_for(lambda: len(query(web, 'up{job="triarch"} == 1')) == 3)
        # the dashboard's histogram queries have data once two scrapes saw the load
        fsync = "histogram_quantile(0.99, sum by (member, le) (rate(triarch_fsync_duration_seconds_bucket[10s])))"  # noqa: E501
        wait_for(lambda: len(query(web, fsync)) == 3)
        commit = "triarch_commit_latency_seconds_count > 0"
        assert len(query(web, commit)) == 1  # the leader's
        leader = int(query(web, "triarch_is_leader == 1")[0]["metric"]["member"])
        follower = (leader + 1) % 3
        cluster.kill(follower)
        wait_for(lambda: query(web, 'ALERTS{alertname="TriarchMemberDown"}'), 20)
        (alert,) = query(web, 'ALERTS{alertname="TriarchMemberDown"}')
        assert alert["metric"]["instance"] == f"127.0.0.1:{metrics[follower]}"
        assert alert["metric"]["alertstate"] == "pending"
        assert query(web, 'ALERTS{alertname="TriarchNoLeaderInCluster"}') == []
    finally:
        cluster.stop_all()
        prometheus.terminate()
        prometheus.wait(10)
        log.close()

"""`/metrics` carries the process metrics every Prometheus exporter has (issue 35): a real
single-member node process scraped and parsed with Prometheus' own text parser, its
figures checked against what /proc says of that process."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_metrics_http import get, healthy, wait_for

from cluster.local import LocalCluster, free_ports

RULES = Path(__file__).resolve().parents[2] / "docs" / "monitoring" / "triarch-alerts.yml"
PROCESS = {
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_cpu_seconds": "counter",  # the parser drops `_total`
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "process_start_time_seconds": "gauge",
}


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' in /proc/<pid>/limits")


def test_a_member_exports_its_process_metrics(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    cluster = LocalCluster(
        1, "cluster.examples.echo:EchoService", tmp_path, extra_args=["--metrics-port", str(port)]
    )
    began = time.time()
    try:
        proc = cluster.start(0)
        wait_for(lambda: healthy(port))
        status, body = get(port, "/metrics")
        assert status == 200
        text = body.decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        values = {}
        for name, kind in PROCESS.items():
            assert families[name].type == kind, name
            (sample,) = families[name].samples
            assert sample.labels == {}  # as every exporter: Prometheus adds `instance`
            values[name] = sample.value
        assert "process_cpu_seconds_total " in text  # the full name on the wire
        assert families["python_info"].samples[0].labels["implementation"]

        pid = proc.pid
        page = os.sysconf("SC_PAGE_SIZE")
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        assert 10 << 20 < values["process_resident_memory_bytes"] < 2 << 30
        assert abs(values["process_resident_memory_bytes"] - rss) < 64 << 20
        assert values["process_virtual_memory_bytes"] >= values["process_resident_memory_bytes"]
        assert 0 < values["process_cpu_seconds"] < time.time() - began + 1
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        assert 5 < values["process_open_fds"] <= fds + 8
        # the limit as the node raised it at start-up (cluster.descriptors), not the test's
        assert values["process_max_fds"] == soft_nofile(pid)
        assert values["process_max_fds"] > values["process_open_fds"]
        assert began - 2 < values["process_start_time_seconds"] <= time.time()
    finally:
        cluster.stop_all()


def test_the_alert_rules_query_process_metrics_the_exporter_has() -> None:
    rules = yaml.safe_load(RULES.read_text())["groups"]
    exprs = " ".join(r["expr"] for g in rules for r in g["rules"])
    named = set(re.findall(r"\b(process_[a-z_]+)\b", exprs))
    assert {"process_open_fds", "process_max_fds", "process_resident_memory_bytes"} <= named
    assert named <= {n.replace("process_cpu_seconds", "process_cpu_seconds_total") for n in PROCESS}

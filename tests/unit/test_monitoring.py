"""The Grafana dashboard and the Prometheus alert rules in docs/monitoring (issue #21):
they load, they cover what the issue names, and every metric they query is one a member
exports (from the exporter's own output, parsed as Prometheus parses it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.agents.exporter import StatusCollector
from cluster.agents.timings import Timings
from cluster.metrics import LatencyHistogram
from cluster.protocol.admin import DiskStatus, FollowerStatus, MemberStatus

DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
RULES = DOCS / "triarch-alerts.yml"
DASHBOARD = DOCS / "triarch-dashboard.json"
NAME = re.compile(r"\b(triarch_[a-z_]+)\b")


def exported_names() -> set[str]:
    """Every sample name a leader with two followers exports."""
    timings = Timings()
    timings.replication[1] = LatencyHistogram()
    status = MemberStatus(
        member_id=0,
        role="LEADER",
        followers=[FollowerStatus(member_id=1, match_position=10, lag_bytes=0, lag_s=0.0)],
        disk=DiskStatus(free_bytes=1 << 30),
        histograms=timings.statuses(LatencyHistogram()),
        last_snapshot_position=1 << 20,
        last_snapshot_time_ms=1_700_000_000_000,
        last_snapshot_age_s=12.5,
        snapshot_log_bytes=64 << 20,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_metric_queried_is_exported() -> None:
    names = exported_names()
    rules = yaml.safe_load(RULES.read_text())["groups"]
    exprs = [r["expr"] for g in rules for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {n for e in exprs for n in NAME.findall(e)}
    assert queried, "no triarch_ metric in the docs?"
    assert queried - names == set()
    assert len(queried) >= 15


def test_the_alert_rules_cover_what_operators_need() -> None:
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    for needed in (
        "TriarchNoLeader",
        "TriarchFrequentLeaderChanges",
        "TriarchMemberDown",
        "TriarchFollowerLagging",
        "TriarchFsyncSlow",
        "TriarchDiskFull",
    ):
        assert needed in alerts
    for rule in alerts.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
        assert rule["expr"].count("(") == rule["expr"].count(")")


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "triarch-cluster"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert p["targets"]
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["gridPos"]["w"] <= 24
    titles = " ".join(p["title"] for p in panels)
    for word in ("Leader", "fsync", "Commit latency", "Replication lag", "Disk"):
        assert word in titles


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""``cluster-backup --metrics-port``: ``GET /metrics`` (Prometheus text) and ``GET /health``.

``triarch_backup_lag_bytes`` is the cluster's commit position (the leader's view) minus
the end of the log the backup holds.  ``/health`` answers 200 while the last poll that
brought the backup up to date is recent (``--max-poll-age``) and the lag is within
``--max-lag``, else 503; its JSON body says why either way.  The same server as the member's
(:class:`cluster.agents.exporter.MetricsHttp`): one request per connection, at most 8 KiB
of request within 5 s, a few connections at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..agents.exporter import MetricsHttp
from .follow import BackupState


class BackupCollector(Collector):
    def __init__(self, state: BackupState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state
        gauges = (
            ("triarch_backup_lag_bytes", "the cluster's commit position (leader's view) "
             "minus the end of the log the backup holds", s.lag_bytes),
            ("triarch_backup_lag_before_pull_bytes", "the lag at the start of the last "
             "successful poll (how far behind it fell over the interval)", s.lag_before_pull),
            ("triarch_backup_position", "the end of the log the backup holds", s.held),
            ("triarch_backup_cluster_commit_position", "the leader's commit position at "
             "the last poll", s.cluster_commit),
            ("triarch_backup_log_start", "where the backup's log begins", s.log_start),
            ("triarch_backup_snapshot_position", "the newest snapshot the backup holds",
             s.snapshot_position),
            ("triarch_backup_source_member", "the member read from at the last poll",
             s.source_member),
            ("triarch_backup_last_poll_age_seconds", "seconds since the last successful poll",
             -1 if s.last_ok is None else time.monotonic() - s.last_ok),
        )  # fmt: skip
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], float(value))
            yield gauge
        counters = (
            ("triarch_backup_polls", "polls", s.polls),
            ("triarch_backup_poll_failures", "polls that no member could serve", s.failures),
            ("triarch_backup_pulled_bytes", "log bytes pulled", s.bytes_pulled),
            ("triarch_backup_snapshots_pulled", "snapshots pulled", s.snapshots_pulled),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], float(value))
            yield counter


class BackupHttp(MetricsHttp):
    """Serves ``/metrics`` and ``/health`` for one backup."""

    def __init__(
        self, host: str, port: int, state: BackupState, max_lag: int, max_age: float
    ) -> None:
        super().__init__(host, port, CollectorRegistry(auto_describe=False))
        self.state = state
        self.max_lag, self.max_age = max_lag, max_age
        self.registry.register(BackupCollector(state))

    def health(self) -> tuple[bool, list[str], dict[str, object]]:
        s = self.state
        ok, reasons = s.health(self.max_lag, self.max_age)
        return (
            ok,
            reasons,
            {
                "lag_bytes": s.lag_bytes,
                "held": s.held,
                "cluster_commit": s.cluster_commit,
                "source_member": s.source_member,
            },
        )

"""``cluster-backup --metrics-port``: ``GET /metrics`` (Prometheus text) and ``GET /health``.

``triarch_backup_lag_bytes`` is the cluster's commit position (the leader's view) minus
the end of the log the backup holds.  ``/health`` answers 200 while the last poll that
brought the backup up to date is recent (``--max-poll-age``) and the lag is within
``--max-lag``, else 503; its JSON body says why either way.  Like the member's exporter
(:mod:`cluster.agents.exporter`): one request per connection, at most 8 KiB of request
within 5 s, a few connections at a time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..agents.exporter import MAX_CONNECTIONS, MAX_PER_ADDRESS, MAX_REQUEST, REQUEST_TIMEOUT
from ..transport.gate import ConnectionGate, gated
from ..transport.tcp import TcpNetwork
from .follow import BackupState

REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


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


def _response(code: int, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class BackupHttp:
    """Serves ``/metrics`` and ``/health`` for one backup."""

    def __init__(
        self, host: str, port: int, state: BackupState, max_lag: int, max_age: float
    ) -> None:
        self.host, self.port = host, port
        self.state = state
        self.max_lag, self.max_age = max_lag, max_age
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BackupCollector(state))
        self.gate = ConnectionGate("metrics port", MAX_CONNECTIONS, MAX_PER_ADDRESS)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await TcpNetwork().serve(
            self.host, self.port, gated(self._handle, self.gate), task_status=task_status
        )

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REQUEST_TIMEOUT):
                data = b""
                while b"\r\n\r\n" not in data and b"\n\n" not in data:
                    if len(data) > MAX_REQUEST:
                        return
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    data += chunk
                line = data.split(b"\n", 1)[0].decode("latin-1").strip()
                if line:
                    await stream.send_all(self.answer(line))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    def answer(self, request_line: str) -> bytes:
        parts = request_line.split()
        if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
            return _response(405, "text/plain", b"only GET\n")
        path = parts[1].split("?", 1)[0]
        if path == "/metrics":
            return _response(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
        if path == "/health":
            ok, reasons = self.state.health(self.max_lag, self.max_age)
            body = json.dumps({
                "health": ok,
                "reason": "; ".join(reasons),
                "reasons": reasons,
                "lag_bytes": self.state.lag_bytes,
                "held": self.state.held,
                "cluster_commit": self.state.cluster_commit,
                "source_member": self.state.source_member,
            }).encode()  # fmt: skip
            return _response(200 if ok else 503, "application/json", body + b"\n")
        return _response(404, "text/plain", b"/metrics or /health\n")

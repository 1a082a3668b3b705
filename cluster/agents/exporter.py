"""``--metrics-port``: ``GET /metrics`` (Prometheus text format) and ``GET /health``.

The metrics are read at scrape time from the member's status (what ``cluster-tool
describe`` shows), through ``prometheus-client``'s collector interface, so nothing is
counted twice and the hot path pays nothing.  Names follow Prometheus' conventions:
``triarch_`` prefix, counters end in ``_total``, sizes in ``_bytes``.  Beside them, the
``process_*`` metrics every Prometheus exporter has (resident and virtual memory, CPU
seconds, open and maximum file descriptors, start time: ``prometheus_client``'s process
collector, read from ``/proc/self`` at scrape time) and ``python_info``.

``/health`` answers 200 when this member can take its part in writes now: its module is
ACTIVE, its disk writable, it is not catching up, and it leads, is ready and heard from a
quorum within the heartbeat timeout, or it follows a leader it heard from within it
(:meth:`MemberStatus.health`).  Otherwise 503.  The small JSON body says why either way:
``health``, ``reason`` (every reason, "; "-joined: "leader", "follows leader 1",
"suspended", "no leader (election CANVASS)", "no quorum (...)", "disk full: ...",
"catching up"), ``reasons`` (the same as a list), ``member``, ``role``, ``module_state``
and ``catching_up``.  The server is deliberately small: one request per
connection, a request line and headers of at most 8 KiB within 5 s, nothing else read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..core.consensus import ConsensusModule
from ..protocol.admin import MemberStatus
from ..status import sees_quorum as status_sees_quorum
from ..transport.gate import ConnectionGate, gated
from ..transport.tcp import TcpNetwork

log = logging.getLogger("cluster.metrics")

MAX_REQUEST = 8 << 10
REQUEST_TIMEOUT = 5.0
ROLES = ("LEADER", "FOLLOWER", "CANDIDATE")
HISTOGRAMS = {
    "fsync": (
        "triarch_fsync_duration_seconds",
        "fdatasync of each archive append (group commit)",
    ),
    "duty_cycle": (
        "triarch_duty_cycle_duration_seconds",
        "one consensus duty cycle: the inbox taken, the log written or handed off, "
        "committed entries applied, replies sent",
    ),
    "commit": (
        "triarch_commit_latency_seconds",
        "a leader's log from publication to commit (one value per duty cycle)",
    ),
    "replication": (
        "triarch_replication_lag_seconds",
        "a leader's view, sampled every slow tick: how long ago it published the oldest "
        "log a follower has not confirmed",
    ),
    "stall": (
        "triarch_loop_stall_seconds",
        "event-loop stalls over --stall-threshold: a pass of the loop that ran this long, "
        "or a wake-up this late",
    ),
}


class StatusCollector(Collector):
    """Prometheus metrics from one member's :class:`MemberStatus`."""

    def __init__(self, status: Callable[[], MemberStatus]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        member = str(s.member_id)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["member"])
            g.add_metric([member], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["member"])
            c.add_metric([member], value)
            return c

        role = GaugeMetricFamily(
            "triarch_role", "1 for this member's role", labels=["member", "role"]
        )
        for name in ROLES:
            role.add_metric([member, name], 1.0 if s.role == name else 0.0)
        yield role
        yield gauge("triarch_is_leader", "1 if this member leads", s.role == "LEADER")
        yield gauge(
            "triarch_leader_member_id",
            "the leader this member knows (-1: none)",
            s.leader_member_id,
        )
        yield gauge("triarch_leadership_term", "the leadership term", s.leadership_term_id)
        positions = GaugeMetricFamily(
            "triarch_log_position_bytes", "log positions", labels=["member", "kind"]
        )
        for kind, value in (
            ("published", s.published_position),
            ("durable", s.append_position),
            ("commit", s.commit_position),
            ("applied", s.applied_position),
        ):
            positions.add_metric([member, kind], value)
        yield positions
        for name, doc, unit in (
            ("bytes", "durable log a follower has not acknowledged", "lag_bytes"),
            ("seconds", "age of the oldest log a follower has not confirmed", "lag_s"),
        ):
            lag = GaugeMetricFamily(
                f"triarch_follower_lag_{name}",
                f"a leader's view: {doc}",
                labels=["member", "follower"],
            )
            for f in s.followers:
                if (value := getattr(f, unit)) is not None:
                    lag.add_metric([member, str(f.member_id)], value)
            yield lag
        yield gauge("triarch_sessions", "open client sessions", len(s.sessions))
        yield gauge(
            "triarch_kept_reply_bytes",
            "bytes of replies kept until their clients confirm them, all sessions "
            "(each at most --max-kept-replies)",
            sum(session.kept_reply_bytes for session in s.sessions),
        )
        yield gauge("triarch_pending_sessions", "sessions connecting", s.pending_sessions)
        yield counter(
            "triarch_elections_total",
            "elections this member entered",
            s.counters.get("elections", 0),
        )
        yield counter("triarch_snapshots_total", "snapshots this member took", s.snapshots_taken)
        yield counter(
            "triarch_auto_snapshots_total",
            "snapshots this member asked for by itself as leader (--snapshot-log-bytes, "
            "--snapshot-interval)",
            s.auto_snapshots,
        )
        if s.last_snapshot_position >= 0:
            yield gauge(
                "triarch_last_snapshot_position_bytes",
                "log position of the last snapshot recorded on this member",
                s.last_snapshot_position,
            )
            yield gauge(
                "triarch_last_snapshot_timestamp_seconds",
                "cluster time (Unix seconds) of the last snapshot: the same on every member",
                s.last_snapshot_time_ms / 1e3,
            )
        if s.last_snapshot_age_s is not None:
            yield gauge(
                "triarch_last_snapshot_age_seconds",
                "seconds since the last snapshot recorded on this member",
                s.last_snapshot_age_s,
            )
        yield gauge(
            "triarch_log_bytes_since_snapshot",
            "log this member holds after its last snapshot (what a restart replays)",
            s.log_bytes_since_snapshot,
        )
        if s.snapshot_log_bytes > 0:
            yield gauge(
                "triarch_snapshot_log_bytes",
                "log after the last snapshot that makes the leader take the next one "
                "(--snapshot-log-bytes, or the last snapshot's size if more)",
                s.snapshot_log_bytes,
            )
        yield counter(
            "triarch_snapshot_failures_total",
            "snapshots this member could not take or write (it goes on without them)",
            s.counters.get("snapshot_failures", 0),
        )
        yield counter(
            "triarch_snapshot_fallbacks_total",
            "followers this leader sent its snapshot because the record they needed next "
            "is corrupt in its archive",
            s.counters.get("snapshot_fallbacks", 0),
        )
        yield counter(
            "triarch_service_errors_total",
            "exceptions the clustered service raised from a callback (caught on every "
            "member alike: --on-service-error)",
            s.counters.get("service_errors", 0),
        )
        yield counter(
            "triarch_leader_stalls_total",
            "times this leader did not run for a second or more (paused, starved of CPU); "
            "its sessions were not blamed for it",
            s.counters.get("leader_stalls", 0),
        )
        yield counter(
            "triarch_replies_dropped_total",
            "the service's replies this leader could not deliver (the client was between "
            "connections); its client is told how many",
            s.counters.get("replies_dropped", 0),
        )
        yield counter(
            "triarch_duplicate_messages_total",
            "session messages this leader dropped because its log holds them already (a "
            "client's resend: exactly once in)",
            s.counters.get("duplicate_messages", 0),
        )
        yield counter(
            "triarch_sequence_gaps_total",
            "session messages this leader dropped because one before them never came (it "
            "asked their client for the rest)",
            s.counters.get("sequence_gaps", 0),
        )
        yield counter(
            "triarch_queries_total",
            "queries this member answered from the service (reads without the log)",
            s.counters.get("queries", 0),
        )
        yield counter(
            "triarch_follower_queries_total",
            "follower-consistency queries this member answered from its applied state",
            s.counters.get("follower_queries", 0),
        )
        yield counter(
            "triarch_queries_dropped_total",
            "follower queries dropped unanswered (their session or connection closed first)",
            s.counters.get("queries_dropped", 0),
        )
        yield counter(
            "triarch_query_errors_total",
            "queries whose on_query raised (the client got a ServiceError)",
            s.counters.get("query_errors", 0),
        )
        yield counter(
            "triarch_queries_refused_total",
            "queries answered BUSY, NOT_LEADER or REFUSED (the client asks again, or elsewhere)",
            s.counters.get("queries_refused", 0),
        )
        yield counter(
            "triarch_read_rounds_total",
            "heartbeat rounds this leader began to confirm it still leads, for queries",
            s.counters.get("read_rounds", 0),
        )
        yield counter(
            "triarch_later_terms_ignored_total",
            "messages of a later term from a member not in touch, ignored while this member "
            "had a live leader (a forged or stray message)",
            s.counters.get("later_terms_ignored", 0),
        )
        yield counter(
            "triarch_protocol_errors_total",
            "connections closed for bad bytes (ingress and member links)",
            s.ingress.protocol_errors + s.link_protocol_errors,
        )
        yield counter(
            "triarch_member_link_silences_total",
            "member links closed (and dialled again) because nothing came on them for the "
            "silence bound: a partition, a paused or overloaded member",
            sum(link.silences + link.silent_inbound for link in s.links),
        )
        yield counter(
            "triarch_ingress_connections_total",
            "client connections accepted",
            s.ingress.connections,
        )
        yield gauge(
            "triarch_ingress_open_connections",
            "client connections open",
            s.ingress.open_connections,
        )
        yield counter(
            "triarch_ingress_refused_connections_total",
            "client connections closed at accept, before any byte (the cap, or the share "
            "per address)",
            s.ingress.refused_at_accept,
        )
        yield counter(
            "triarch_ingress_partial_frames_refused_total",
            "connections without a session closed: their unfinished frame did not fit the "
            "budget strangers share",
            s.ingress.partial_refused,
        )
        yield counter(
            "triarch_pending_sessions_evicted_total",
            "connecting sessions that gave their slot to another address's (fair shares)",
            s.counters.get("evicted_pending_sessions", 0),
        )
        yield counter(
            "triarch_sessions_given_back_total",
            "open sessions without a connection closed to give their slot to a new one",
            s.counters.get("sessions_given_back", 0),
        )
        yield gauge("triarch_disk_full", "1 while writes fail for want of space", s.disk.full)
        yield gauge("triarch_disk_failing", "1 while any write fails", bool(s.disk.problem))
        yield counter(
            "triarch_disk_write_failures_total", "writes that failed", s.disk.write_failures
        )
        if s.disk.free_bytes >= 0:
            yield gauge(
                "triarch_disk_free_bytes", "free space of the data directory", s.disk.free_bytes
            )
        yield counter(
            "triarch_archive_errors_total", "archive records found corrupt", s.archive_errors
        )
        yield gauge("triarch_uptime_seconds", "seconds since the node started", s.uptime_s)
        info = GaugeMetricFamily(
            "triarch_build_info", "1, with the member's version", labels=["member", "version"]
        )
        info.add_metric([member, s.version], 1.0)
        yield info
        yield counter(
            "triarch_leader_changes_total",
            "times this member saw a new leader (itself included)",
            s.leader_changes,
        )
        yield gauge("triarch_archive_bytes", "bytes of log in the archive", s.archive_bytes)
        stalls = CounterMetricFamily(
            "triarch_loop_stalls",
            "event-loop stalls over --stall-threshold, by kind (cluster-tool stalls)",
            labels=["member", "kind"],
        )
        stalls.add_metric([member, "busy"], s.stalls.busy)
        stalls.add_metric([member, "late"], s.stalls.late)
        yield stalls
        yield from _histograms(s)


def _histograms(s: MemberStatus) -> Iterator[Metric]:
    families: dict[str, HistogramMetricFamily] = {}
    for h in s.histograms:
        if h.name not in HISTOGRAMS or len(h.counts) != len(h.bounds) + 1:
            continue
        name, doc = HISTOGRAMS[h.name]
        keys = sorted(h.labels)
        family = families.get(h.name)
        if family is None:
            family = families[h.name] = HistogramMetricFamily(name, doc, labels=["member", *keys])
        buckets = []
        seen = 0
        for bound, count in zip([*map(repr, h.bounds), "+Inf"], h.counts, strict=True):
            seen += count
            buckets.append((bound, float(seen)))
        family.add_metric([str(s.member_id), *(h.labels[k] for k in keys)], buckets, h.sum)
    yield from families.values()


def sees_quorum(cm: ConsensusModule, clock_ns: Callable[[], int]) -> bool:
    """A ready leader that heard from a quorum within the heartbeat timeout, or a
    follower that heard from its leader within it (:func:`cluster.status.sees_quorum`)."""
    return status_sees_quorum(cm, clock_ns())


def health(status: MemberStatus, heard_within: bool) -> tuple[bool, str]:
    """Whether this member can take its part in writes now (``heard_within``: it sees a
    quorum, :func:`sees_quorum`), and why: every reason :meth:`MemberStatus.health`
    gives, joined by "; " ("leader", "follows leader 1"; "suspended", "no quorum (...)",
    "disk full: ...", ...)."""
    ok, reasons = status.health(heard_within)
    return ok, "; ".join(reasons)


MAX_CONNECTIONS = 32
"""Connections open at once on the metrics port (each lives at most
:data:`REQUEST_TIMEOUT`); more are closed at accept."""
MAX_PER_ADDRESS = 8
"""Of them, from one source address."""


class MetricsHttp:
    """``GET /metrics`` (``registry``) and ``GET /health`` (:meth:`health`) on
    ``host:port``: one request per connection, at most :data:`MAX_REQUEST` bytes of it
    within :data:`REQUEST_TIMEOUT`, connections counted at accept.  The member's
    :class:`MetricsServer` and ``cluster-backup``'s server are two of these."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.requests = 0
        self.gate = ConnectionGate("metrics port", MAX_CONNECTIONS, MAX_PER_ADDRESS)
        """Counted at accept: more are closed at once (a scraper needs one or two)."""

    def health(self) -> tuple[bool, list[str], dict[str, object]]:
        """Healthy or not, the reasons, and what else ``/health``'s JSON body says."""
        raise NotImplementedError

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        # plain TCP: accepts paused while out of descriptors, a port in use a ListenError
        await TcpNetwork().serve(
            self.host, self.port, gated(self._handle, self.gate), task_status=task_status
        )

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REQUEST_TIMEOUT):
                request = await self._read_request(stream)
                if request is not None:
                    self.gate.prove(stream)  # a whole request: a flood cannot push it out
                    await stream.send_all(self._answer(request))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    @staticmethod
    async def _read_request(stream: trio.SocketStream) -> str | None:
        data = b""
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            if len(data) > MAX_REQUEST:
                return None
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
        line = data.split(b"\n", 1)[0].decode("latin-1").strip()
        return line or None

    def _answer(self, request_line: str) -> bytes:
        self.requests += 1
        parts = request_line.split()
        if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
            return _response(405, "text/plain", b"only GET\n")
        path = parts[1].split("?", 1)[0]
        if path == "/metrics":
            return _response(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
        if path == "/health":
            ok, reasons, more = self.health()
            body = json.dumps(
                {"health": ok, "reason": "; ".join(reasons), "reasons": reasons, **more}
            ).encode()
            return _response(200 if ok else 503, "application/json", body + b"\n")
        return _response(404, "text/plain", b"/metrics or /health\n")


class MetricsServer(MetricsHttp):
    """A member's ``/metrics`` and ``/health``."""

    def __init__(
        self,
        host: str,
        port: int,
        status: Callable[[], MemberStatus],
        healthy: Callable[[], bool],
    ) -> None:
        super().__init__(host, port, CollectorRegistry(auto_describe=False))
        self.status = status
        self.healthy = healthy
        self.registry.register(StatusCollector(status))
        # process_resident_memory_bytes, process_open_fds, ...: the names every exporter uses
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def health(self) -> tuple[bool, list[str], dict[str, object]]:
        status = self.status()
        ok, reasons = status.health(self.healthy())
        return (
            ok,
            reasons,
            {
                "member": status.member_id,
                "role": status.role,
                "module_state": status.module_state,
                "catching_up": status.catching_up,
            },
        )


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def _response(code: int, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body

"""Node configuration: defaults < TOML file < ``CLUSTER_*`` environment < command-line flags.

Every setting is one :class:`Setting`: its flag (``--session-timeout``), its environment
variable (``CLUSTER_SESSION_TIMEOUT``) and its TOML key (``session-timeout`` or
``session_timeout``) are the same setting.  Durations accept ``10s``, ``200ms``,
``500us``, ``1m``; sizes accept ``4096``, ``64KiB``, ``1MiB``.  Defaults follow Aeron
Cluster's where Aeron has one.

One idea: the node's configuration, the settings table (:data:`SETTINGS`, with the
value parsers it names), the :class:`NodeConfig` it fills and the resolving of the four
sources into it.  The command-line conventions every command shares (``--version``,
usage errors, duration arguments) are :mod:`cluster.cli`'s, re-exported here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .archive.segments import FsyncPolicy
from .cli import UsageParser as UsageParser
from .cli import add_version as add_version
from .cli import duration_seconds as duration_seconds
from .members import (
    DEFAULT_ADMIN_PORT as DEFAULT_ADMIN_PORT,
)
from .members import (
    DEFAULT_CONSENSUS_PORT as DEFAULT_CONSENSUS_PORT,
)
from .members import (
    DEFAULT_HOST as DEFAULT_HOST,
)
from .members import (
    DEFAULT_INGRESS_PORT as DEFAULT_INGRESS_PORT,
)
from .members import (
    ConfigError as ConfigError,
)
from .members import (
    MemberEndpoints as MemberEndpoints,
)
from .members import (
    check_members as check_members,
)
from .members import (
    format_ingress_endpoints as format_ingress_endpoints,
)
from .members import (
    host_error as host_error,
)
from .members import (
    members_difference as members_difference,
)
from .members import (
    members_digest as members_digest,
)
from .members import (
    parse_members as parse_members,
)
from .protocol.framing import DEFAULT_MAX_FRAME_SIZE
from .units import format_duration as format_duration
from .units import format_size as format_size
from .units import not_negative as _not_negative
from .units import or_off as _or_off
from .units import parse_bool as parse_bool
from .units import parse_duration_ns as parse_duration_ns
from .units import parse_int as _int
from .units import parse_port as _port
from .units import parse_size as parse_size
from .units import positive as _positive
from .units import show_or_off as _show_or_off

MAX_KEPT_REPLIES = 16 << 20
"""The most ``--max-kept-replies`` may be: a session's kept replies go into one snapshot
record, and a record is at most 64 MiB."""


def _kept_replies(text: Any) -> int:
    value = _positive(parse_size)(text)
    if value > MAX_KEPT_REPLIES:
        raise ValueError(f"must be at most 16MiB (a snapshot record holds them), got {text!r}")
    return value


def _retention(text: Any) -> int:
    value = _int(text)
    if value < 0:
        raise ValueError(f"must not be negative, got {text!r}")
    return value


def _cluster_id(text: Any) -> int:
    if str(text).strip().lower() == "auto":
        return -1  # the data directory's
    value = _int(text)
    if not 0 <= value < 1 << 31:
        raise ValueError(f"must be in 0..{(1 << 31) - 1}, got {text!r}")
    return value


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: Any) -> str:
    level = str(text).strip().upper()
    if level not in _LOG_LEVELS:
        raise ValueError(f"not a log level: {text!r} (one of {', '.join(_LOG_LEVELS)})")
    return level


def _flag(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false: {text!r}")


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(text: Any) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"not one of {', '.join(choices)}: {text!r}")
        return value

    return check


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str
    show: Callable[[Any], str] = str


SETTINGS: tuple[Setting, ...] = (
    Setting("member-id", 0, _int, "this member's id in --members"),
    Setting(
        "members",
        "",
        str,
        "cluster members: 0=host:ingress:consensus:admin,1=...; empty = a single-member "
        f"cluster on {DEFAULT_HOST}:{DEFAULT_INGRESS_PORT}:{DEFAULT_CONSENSUS_PORT}:"
        f"{DEFAULT_ADMIN_PORT}",
    ),
    Setting(
        "cluster-id",
        -1,
        _cluster_id,
        "this cluster's id: a member link from a member of another cluster is refused, and "
        "so is a data directory of another cluster; auto: the id the data directory "
        "records, or 0 for a new one",
        lambda value: "auto" if value < 0 else str(value),
    ),
    Setting(
        "certs-dir",
        "",
        str,
        "this member's folder from `cluster-tool certs` (member-<id>): mutual TLS on the "
        "ingress, consensus and admin ports; empty = plaintext, loopback addresses only",
    ),
    Setting(
        "insecure",
        False,
        _flag,
        "allow plaintext on a non-loopback address (a network you trust): true or false",
    ),
    Setting("dir", "cluster-data", str, "data directory (archive segments, recording log)"),
    Setting(
        "service", "cluster.examples.kv:KeyValueService", str, "the clustered service, MODULE:CLASS"
    ),
    Setting(
        "on-service-error",
        "continue",
        _choice("continue", "stop"),
        "what a member does when a service callback raises (every member raises on the "
        "same log entry alike): continue, log it (once per distinct error with its "
        "traceback), count it (triarch_service_errors_total), tell the client whose message "
        "it was (client.ServiceError) and go on past the entry; stop, log it and exit with "
        "code 1 (a restart replays the entry and stops again)",
    ),
    Setting(
        "authenticator",
        "",
        str,
        "authenticator MODULE:CLASS (empty = accept every client as anonymous)",
    ),
    Setting(
        "admin-principals",
        "",
        str,
        "comma-separated principals (as the authenticator names them) allowed to "
        "snapshot, suspend, resume or stop the cluster; with no authenticator every "
        "client is anonymous and allowed",
    ),
    Setting(
        "session-timeout",
        10_000_000_000,
        _positive(parse_duration_ns),
        "close a session idle this long",
        format_duration,
    ),
    Setting(
        "leader-heartbeat-timeout",
        10_000_000_000,
        _positive(parse_duration_ns),
        "followers start an election after this long without the leader",
        format_duration,
    ),
    Setting(
        "leader-heartbeat-interval",
        200_000_000,
        _positive(parse_duration_ns),
        "leader sends CommitPosition at least this often",
        format_duration,
    ),
    Setting(
        "election-timeout",
        1_000_000_000,
        _positive(parse_duration_ns),
        "candidate ballot timeout",
        format_duration,
    ),
    Setting(
        "startup-canvass-timeout",
        500_000_000,
        _positive(parse_duration_ns),
        "at start-up, how long to wait for every member to answer before electing with a "
        "quorum of members (a member missing then joins as a follower when it comes)",
        format_duration,
    ),
    Setting(
        "slow-disk-threshold",
        1_000_000_000,
        _or_off(parse_duration_ns),
        "a leader whose every append, for --slow-disk-period, took longer than this to "
        "become durable on its own disk (a dying disk) hands leadership over; 0 or none: "
        "never (a leader whose log does not become durable at all hands over after "
        "--leader-heartbeat-timeout either way)",
        _show_or_off(format_duration),
    ),
    Setting(
        "slow-disk-period",
        10_000_000_000,
        _positive(parse_duration_ns),
        "how long every append must have been slower than --slow-disk-threshold",
        format_duration,
    ),
    Setting(
        "initial-cluster-state",
        "auto",
        _choice("auto", "new"),
        "how a new (empty) data directory starts: auto, as a catch-up member that votes "
        "once a leader has caught it up, or once every member answers with an empty log "
        "(a brand-new cluster); new, voting at once: only for the first start of a "
        "brand-new cluster some of whose members are not there yet (never for a replaced "
        "disk: it could vote a stale member in); a directory that exists ignores it",
    ),
    Setting(
        "slow-tick-interval",
        10_000_000,
        _positive(parse_duration_ns),
        "period of the slow tick (sessions, timeouts, heartbeats)",
        format_duration,
    ),
    Setting(
        "max-concurrent-sessions",
        10,
        _positive(_int),
        "more client sessions than this are rejected with ERROR",
    ),
    Setting(
        "max-pending-sessions",
        16,
        _positive(_int),
        "sessions connecting at once (authenticating, not yet open), apart from open ones",
    ),
    Setting(
        "max-pending-per-address",
        4,
        _positive(_int),
        "sessions connecting at once from one client address (an IPv6 address counts "
        "by its /64); when every pending slot is taken, a request takes the place of the "
        "longest-waiting one of the address holding the most, if it holds more than the "
        "newcomer's",
    ),
    Setting(
        "max-session-queries",
        256,
        _positive(_int),
        "queries (reads without the log) one session may have waiting at a member (the "
        "leader's linearizable ones and follower reads together); one more is answered BUSY "
        "and the client asks again (a follower read: another member)",
    ),
    Setting(
        "max-queries",
        8192,
        _positive(_int),
        "queries all sessions together may have waiting at a member; one more is answered BUSY",
    ),
    Setting(
        "resume-grace",
        250_000_000,
        _not_negative(parse_duration_ns),
        "a session whose connection dropped keeps its slot for a resume this long once "
        "every --max-concurrent-sessions slot is taken and another session needs one, "
        "then is closed (TIMEOUT) to give it up; while slots are free it waits a whole "
        "--session-timeout; raise it for clients far away",
        format_duration,
    ),
    Setting(
        "memory-trim-interval",
        30_000_000_000,
        _positive(parse_duration_ns),
        "how often the node gives the free pages of its heap back to the system "
        "(malloc_trim, glibc only): what a burst or a flood took goes back within it",
        format_duration,
    ),
    Setting(
        "max-connections",
        1024,
        _positive(_int),
        "client connections open at once on the ingress port, counted at accept (before "
        "a TLS handshake); more are closed at once (lowered to fit the descriptor limit)",
    ),
    Setting(
        "max-connections-per-address",
        0,
        _not_negative(_int),
        "ingress connections open at once from one source address, counted at accept; "
        "0: a quarter of --max-connections, at least 4",
    ),
    Setting(
        "max-admin-connections",
        16,
        _positive(_int),
        "connections open at once on the admin port",
    ),
    Setting(
        "admin-idle-timeout",
        60_000_000_000,
        _positive(parse_duration_ns),
        "an admin connection that sends no command for this long is closed",
        format_duration,
    ),
    Setting(
        "handshake-timeout",
        5_000_000_000,
        _positive(parse_duration_ns),
        "a connection must finish its TLS handshake, and an ingress connection open or "
        "resume a session, within this long (and it is closed once it holds none for this "
        "long); until it holds a session its frames may be at most 64KiB",
        format_duration,
    ),
    Setting(
        "max-frame-size",
        DEFAULT_MAX_FRAME_SIZE,
        _positive(parse_size),
        "largest frame accepted on any connection (bytes)",
    ),
    Setting(
        "metrics-port",
        0,
        _port,
        "serve GET /metrics (Prometheus) and GET /health on this port of the member's "
        "host (0: off)",
    ),
    Setting(
        "stall-threshold",
        5_000_000,
        parse_duration_ns,
        "record every event-loop pass that runs, and every wake-up that comes, this much "
        "later than it should, with what ran (cluster-tool stalls; 0: off)",
        format_duration,
    ),
    Setting(
        "ingress-quantum",
        16 << 10,
        _positive(parse_size),
        "bytes of each connection's messages the leader sequences per duty cycle and turn "
        "(deficit round-robin: a flooding client cannot starve the others)",
    ),
    Setting(
        "ingress-window",
        16 << 10,
        _positive(parse_size),
        "while several clients compete, bytes of each connection's messages the leader "
        "holds in its log not yet applied; past it, the connection's turns pass",
    ),
    Setting(
        "max-ingress-backlog",
        256 << 10,
        _positive(parse_size),
        "bytes a connection may have read but not yet sequenced; then it is not read "
        "until they are (TCP pushes back on the client)",
    ),
    Setting(
        "max-log-inflight",
        1 << 20,
        _positive(parse_size),
        "log bytes the leader holds not yet both durable and applied; past it, it takes "
        "no client messages until the archive and the service catch up (back pressure)",
    ),
    Setting(
        "max-egress-backlog",
        8 << 20,
        _positive(parse_size),
        "per-session egress bytes queued before offers fail (back pressure)",
    ),
    Setting(
        "max-kept-replies",
        256 << 10,
        _kept_replies,
        "bytes of a session's replies every member keeps until its client confirms them "
        "(each reply's payload plus 64), so a new leader sends what the client lacks; "
        "past it the oldest go and the client sees the gap",
    ),
    Setting(
        "fsync",
        FsyncPolicy.BATCH,
        FsyncPolicy.parse,
        "archive fsync policy: batch (fdatasync each batch before it counts as appended) or none",
        lambda v: v.value,
    ),
    Setting(
        "archive-io",
        "auto",
        _choice("auto", "inline", "thread"),
        "how log writes run: inline (on the event loop: no thread hand-off, lowest latency), "
        "thread (the node's archive-writer thread: it keeps working while the disk syncs), or auto "
        "(thread on the leader, whose own sync is off the commit path, except for a lone "
        "small batch when its log is quiet; inline on followers)",
    ),
    Setting("segment-size", 64 << 20, _positive(parse_size), "archive segment file size"),
    Setting(
        "archive-retention",
        2,
        _retention,
        "snapshots whose log is kept: after each snapshot, archive segments wholly below "
        "the N-th newest are deleted (a follower that needs them is sent a snapshot); "
        "0 keeps the whole log",
    ),
    Setting(
        "snapshot-log-bytes",
        64 << 20,
        _or_off(parse_size),
        "the leader takes a snapshot by itself (through the log, so every member takes it "
        "at the same position) once this much log was written since the last one, or the "
        "last snapshot's size if that is more; with --archive-retention it bounds each "
        "member's disk and the log a restart replays; 0 or none: only on request",
        _show_or_off(format_size),
    ),
    Setting(
        "snapshot-interval",
        0,
        _or_off(parse_duration_ns),
        "the leader also takes a snapshot by itself once this long passed since the last "
        "one and some log was written; 0 or none: off",
        _show_or_off(format_duration),
    ),
    Setting("log-level", "INFO", _log_level, "logging level"),
    Setting(
        "log-format",
        "text",
        _choice("text", "json"),
        "the log on stderr: text lines, or json (one object a line: time, level, logger, "
        "member, message, exception)",
    ),
)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    member_id: int = 0
    members: str = ""
    cluster_id: int = -1
    """-1: the one the data directory records, or 0 for a new directory."""
    dir: str = "cluster-data"
    service: str = "cluster.examples.kv:KeyValueService"
    on_service_error: str = "continue"
    authenticator: str = ""
    admin_principals: str = ""
    certs_dir: str = ""
    insecure: bool = False
    session_timeout: int = 10_000_000_000
    leader_heartbeat_timeout: int = 10_000_000_000
    leader_heartbeat_interval: int = 200_000_000
    election_timeout: int = 1_000_000_000
    startup_canvass_timeout: int = 500_000_000
    slow_disk_threshold: int = 1_000_000_000
    """Nanoseconds (0: off)."""
    slow_disk_period: int = 10_000_000_000
    initial_cluster_state: str = "auto"
    slow_tick_interval: int = 10_000_000
    max_concurrent_sessions: int = 10
    max_pending_sessions: int = 16
    max_pending_per_address: int = 4
    max_session_queries: int = 256
    max_queries: int = 8192
    resume_grace: int = 250_000_000
    memory_trim_interval: int = 30_000_000_000
    max_connections: int = 1024
    max_connections_per_address: int = 0
    max_admin_connections: int = 16
    admin_idle_timeout: int = 60_000_000_000
    handshake_timeout: int = 5_000_000_000
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    metrics_port: int = 0
    stall_threshold: int = 5_000_000
    ingress_quantum: int = 16 << 10
    ingress_window: int = 16 << 10
    max_ingress_backlog: int = 256 << 10
    max_log_inflight: int = 1 << 20
    max_egress_backlog: int = 8 << 20
    max_kept_replies: int = 256 << 10
    fsync: FsyncPolicy = FsyncPolicy.BATCH
    archive_io: str = "auto"
    segment_size: int = 64 << 20
    archive_retention: int = 2
    snapshot_log_bytes: int = 64 << 20
    snapshot_interval: int = 0
    """Nanoseconds (0: off), as every duration here."""
    log_level: str = "INFO"
    log_format: str = "text"
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """Where each setting given came from, by attribute: ``"command line"``,
    ``"environment"`` or the TOML file's name (see :meth:`named`)."""

    def named(self, name: str) -> str:
        """Setting ``name`` (``certs-dir``) as the operator gave it, for an error about
        its value: ``--certs-dir``, ``$CLUSTER_CERTS_DIR`` or ``certs-dir in FILE``
        (the flag when it was not given)."""
        source = self.sources.get(_attr(name))
        if source == "environment":
            return "$CLUSTER_" + _attr(name).upper()
        if source is None or source == "command line":
            return f"--{name}"
        return f"{name} in {source}"

    @property
    def member_list(self) -> list[MemberEndpoints]:
        if not self.members:
            return [
                MemberEndpoints(
                    self.member_id,
                    DEFAULT_HOST,
                    DEFAULT_INGRESS_PORT,
                    DEFAULT_CONSENSUS_PORT,
                    DEFAULT_ADMIN_PORT,
                )
            ]
        return check_members(parse_members(self.members))

    @property
    def this_member(self) -> MemberEndpoints:
        for member in self.member_list:
            if member.member_id == self.member_id:
                return member
        raise ConfigError(f"--member-id {self.member_id} is not in --members {self.members!r}")

    def session_limits(self) -> dict[str, Any]:
        """The consensus module's bounds on client sessions and their queries, as
        ``ConsensusConfig`` keywords (nanoseconds, counts)."""
        return {
            "session_timeout_ns": self.session_timeout,
            "max_concurrent_sessions": self.max_concurrent_sessions,
            "max_pending_sessions": self.max_pending_sessions,
            "max_pending_per_address": self.max_pending_per_address,
            "resume_grace_ns": self.resume_grace,
            "max_session_queries": self.max_session_queries,
            "max_queries": self.max_queries,
        }

    def replace(self, **changes: Any) -> NodeConfig:
        return dataclasses.replace(self, **changes)


def _attr(name: str) -> str:
    return name.replace("-", "_")


def _apply(
    values: dict[str, Any], source: str, raw: Mapping[str, Any], sources: dict[str, str]
) -> None:
    by_key = {s.name: s for s in SETTINGS} | {_attr(s.name): s for s in SETTINGS}
    for key, text in raw.items():
        setting = by_key.get(key)
        if setting is None:
            raise ConfigError(f"unknown setting {key!r} in {source}")
        try:
            values[_attr(setting.name)] = setting.parse(text)
            sources[_attr(setting.name)] = source
        except (ValueError, TypeError, OverflowError) as exc:  # TOML gives any type
            raise ConfigError(f"bad value for {setting.name} in {source}: {exc}") from None


def build_parser(prog: str = "python -m cluster.node") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one Triarch cluster node. Settings come from defaults, then "
        "--config FILE.toml, then CLUSTER_* environment variables, then flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file of settings")
    add_version(parser)
    for s in SETTINGS:
        env = "CLUSTER_" + _attr(s.name).upper()
        flag = {"nargs": "?", "const": "true"} if s.parse is _flag else {}
        parser.add_argument(
            f"--{s.name}",
            dest=_attr(s.name),
            default=None,
            metavar=_attr(s.name).upper(),
            help=f"{s.help} (default: {s.show(s.default)}; env {env})",
            **flag,  # type: ignore[arg-type]
        )
    return parser


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> NodeConfig:
    """Resolve the configuration from defaults, TOML, environment and ``argv``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config_file = args.config or environ.get("CLUSTER_CONFIG")
    if config_file:
        try:
            with open(config_file, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"bad TOML in {config_file}: {exc}") from None
        _apply(values, config_file, data.get("node", data), sources)
    env = {
        _attr(s.name): environ["CLUSTER_" + _attr(s.name).upper()]
        for s in SETTINGS
        if "CLUSTER_" + _attr(s.name).upper() in environ
    }
    _apply(values, "environment", env, sources)
    flags = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    _apply(values, "command line", flags, sources)
    config = NodeConfig(**values, sources=sources)
    try:
        config.member_list  # noqa: B018  (validate)
    except ValueError as exc:
        raise ConfigError(f"bad --members: {exc}") from None
    config.this_member  # noqa: B018
    return config


def describe(config: NodeConfig) -> str:
    """One line per setting, for the start-up log."""
    lines = []
    for s in SETTINGS:
        lines.append(f"  {s.name} = {s.show(getattr(config, _attr(s.name)))}")
    return "\n".join(lines)


def data_path(config: NodeConfig) -> Path:
    return Path(config.dir)

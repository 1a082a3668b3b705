"""Admin channel: ``cluster-tool`` <-> a member's admin port (Triarch's own, tags 200+).

Aeron's ClusterTool reads mark files and toggles counters in the driver's shared memory;
Triarch members have no shared memory to poke, so each member serves its admin port
(the fourth port of ``--members``) with a request/response protocol: the tool sends an
:class:`AdminCommand`, the member answers with an :class:`AdminReply` carrying the same
``correlation_id``.  Query commands put their result in ``body`` as JSON
(:func:`encode_body` / :func:`decode_body`); ``describe``'s body is a
:class:`MemberStatus`, which the node builds and ``cluster-tool`` and ``cluster-tui``
decode with its type (:func:`decode_status`).  Frames are the usual length-prefixed
MessagePack arrays (:mod:`cluster.protocol.framing`); bad bytes raise
:class:`~cluster.protocol.errors.ProtocolError`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._typing import Int64
from ._base import Message
from .errors import ProtocolError


class AdminCommand(Message, tag=200):
    """A request to one member: ``command`` (e.g. ``describe``) with string ``args``."""

    correlation_id: Int64
    command: str
    args: dict[str, str] = msgspec.field(default_factory=dict)


class AdminReply(Message, tag=201):
    """The answer to an :class:`AdminCommand`; ``body`` is JSON for query commands."""

    correlation_id: Int64
    ok: bool
    message: str
    body: bytes = b""


AdminMessage = AdminCommand | AdminReply


# ---------------------------------------------------------------------- describe


class FollowerStatus(msgspec.Struct, kw_only=True):
    """A leader's view of one follower."""

    member_id: int
    next_position: int = 0
    match_position: int = -1
    lag_bytes: int | None = None
    """How far the follower's confirmed log is behind the leader's durable log."""
    last_heard_ms_ago: int | None = None
    lag_s: float | None = None
    """Seconds since the leader published the oldest log the follower has not confirmed
    (0 when it has everything; None when unknown)."""


class HistogramStatus(msgspec.Struct, kw_only=True):
    """A latency histogram since the member started, in Prometheus' shape: ``counts[i]``
    values at or below ``bounds[i]`` seconds and above the bound before it, and one more
    count for the values above the last bound (``+Inf``)."""

    name: str
    """``fsync``, ``duty_cycle``, ``commit``, ``replication`` or ``stall`` (see the
    exporter)."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    bounds: list[float] = msgspec.field(default_factory=list)
    counts: list[int] = msgspec.field(default_factory=list)
    sum: float = 0.0
    """Seconds, all values together."""
    count: int = 0


class StallStatus(msgspec.Struct, kw_only=True):
    """One event-loop stall (``cluster.agents.stalls``)."""

    at: float
    """When it began (epoch seconds)."""
    kind: str
    """``busy``: a pass of the loop ran this long; ``late``: a wait ended this long after
    the time the loop asked to be woken."""
    duration_s: float
    cpu_s: float = 0.0
    """The loop thread's CPU time in a busy pass, as a sampling thread saw it, scaled to
    the whole pass (much less than the duration: the thread was not running, descheduled
    or waiting for the GIL); -1 when the sampler did not see the pass in time."""
    gc_s: float = 0.0
    """The garbage collector's time in a busy pass."""
    where: str = ""
    """Where the loop was once the pass had run for the threshold (innermost first)."""


class StallsStatus(msgspec.Struct, kw_only=True):
    threshold_s: float = 0.0
    """0: the stall finder is off."""
    busy: int = 0
    late: int = 0
    recent: list[StallStatus] = msgspec.field(default_factory=list)


class LinkStatus(msgspec.Struct, kw_only=True):
    """This member's outbound link to another member."""

    member_id: int
    connected: bool = False
    sent: int = 0
    dropped: int = 0
    connects: int = 0
    backlog: int = 0
    silences: int = 0
    """Links to this member closed because nothing came back for the silence bound."""
    silent_inbound: int = 0
    """Links from this member closed because nothing came on them for the bound."""


class SessionStatus(msgspec.Struct, kw_only=True):
    """One open client session as this member's consensus module holds it."""

    cluster_session_id: int
    state: str = "OPEN"
    response_channel: str = ""
    last_activity_ms_ago: int = 0
    close_reason: str | None = None
    applied_sequence: int = 0
    """The highest sequence of the session's own messages this member's service applied."""
    last_reply: int = 0
    """The number of the last reply the service gave the session (exactly once out)."""
    kept_replies: int = 0
    """Replies this member keeps until the client confirms them, and their bytes
    (payload plus 64 each; at most ``--max-kept-replies``)."""
    kept_reply_bytes: int = 0


class IngressStatus(msgspec.Struct, kw_only=True):
    """The ingress agent's statistics."""

    connections: int = 0
    open_connections: int = 0
    frames: int = 0
    protocol_errors: int = 0
    last_error: str = ""
    refused_at_accept: int = 0
    """Connections closed at accept, before any byte (the cap, or the share per address)."""
    partial_refused: int = 0
    """Connections without a session closed because their unfinished frame did not fit
    the budget strangers share."""


class MemberAddress(msgspec.Struct, kw_only=True):
    """One configured member's endpoints."""

    member_id: int
    host: str = ""
    ingress_port: int = 0
    consensus_port: int = 0
    admin_port: int = 0


class DiskStatus(msgspec.Struct, kw_only=True):
    """The member's disk: whether its writes succeed (``cluster.archive.disk``)."""

    full: bool = False
    """Writes fail for want of space (ENOSPC, EDQUOT): they are retried, and nothing is
    acknowledged meanwhile."""
    problem: str = ""
    """Empty while writes succeed; else what fails and why ("disk full: ...")."""
    failing_for_s: float | None = None
    """Seconds since writes started failing (None while they succeed)."""
    failing: list[str] = msgspec.field(default_factory=list)
    """The write paths failing now (log, recording log, node state, snapshot)."""
    free_bytes: int = -1
    """Free space on the data directory's file system (-1: unknown)."""
    write_failures: int = 0
    """Failed writes since the member started (every retry counted)."""
    full_events: int = 0
    """Times writes started failing since the member started."""
    failed_seconds: float = 0.0
    """Seconds with failing writes since the member started (the current episode too)."""

    @property
    def label(self) -> str:
        """ "disk full" (or "disk error") while writes fail, else ""."""
        if not self.problem:
            return ""
        return "disk full" if self.full else "disk error"

    def summary(self) -> str:
        """One line for people: "" while writes succeed."""
        if not self.problem:
            return ""
        since = f" for {self.failing_for_s:.0f} s" if self.failing_for_s is not None else ""
        return f"{self.label.upper()}{since}: {self.problem}"


class MemberStatus(msgspec.Struct, kw_only=True):
    """What ``describe`` answers: one member's role, terms, positions, sessions,
    counters and links.  Every field but ``member_id`` has a default, so a status
    from an older member (or a recording) decodes too."""

    member_id: int
    role: str = "FOLLOWER"
    """LEADER, FOLLOWER or CANDIDATE (a member in an election)."""
    leadership_term_id: int = -1
    candidate_term_id: int = -1
    leader_member_id: int = -1
    commit_position: int = 0
    append_position: int = 0
    """The end of the durable (archived) log."""
    published_position: int = 0
    applied_position: int = 0
    election_state: str = "INIT"
    module_state: str = "ACTIVE"
    catching_up: bool = False
    """A member whose disk is new or lost: it votes for nobody and counts toward no
    quorum until a leader elected by others has caught it up."""
    sees_quorum: bool | None = None
    """A ready leader that heard from a quorum within the heartbeat timeout, or a follower
    that heard from its leader within it (None: a member too old to say)."""
    sessions: list[SessionStatus] = msgspec.field(default_factory=list)
    pending_sessions: int = 0
    redirect_sessions: int = 0
    redirects: int = 0
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    ingress: IngressStatus = msgspec.field(default_factory=IngressStatus)
    followers: list[FollowerStatus] = msgspec.field(default_factory=list)
    links: list[LinkStatus] = msgspec.field(default_factory=list)
    members: list[MemberAddress] = msgspec.field(default_factory=list)
    snapshots_taken: int = 0
    uptime_s: float = 0.0
    pid: int = 0
    archive_verified: int = 0
    """How far the background check of the archive below the snapshot has got."""
    archive_errors: int = 0
    """Records of this member's archive found corrupt (never shipped to another member)."""
    link_protocol_errors: int = 0
    """Member links closed for a message that failed its checks."""
    disk: DiskStatus = msgspec.field(default_factory=DiskStatus)
    """Whether the member's writes succeed (a full disk)."""
    version: str = ""
    """The member's Triarch version (empty from a member before 0.2)."""
    archive_bytes: int = 0
    """Bytes of log in the member's archive segments (what compaction keeps)."""
    leader_changes: int = 0
    """Times this member saw a new leader (itself included)."""
    histograms: list[HistogramStatus] = msgspec.field(default_factory=list)
    """fsync, duty-cycle, commit and replication latencies since the member started."""
    stalls: StallsStatus = msgspec.field(default_factory=StallsStatus)
    """Event-loop stalls over ``--stall-threshold`` (the most recent of them)."""
    last_snapshot_position: int = -1
    """The log position of the last snapshot recorded on this member, whoever asked for
    it (-1: none, or a member too old to say)."""
    last_snapshot_time_ms: int = 0
    """Its cluster time (epoch ms; 0: none): the same on every member."""
    last_snapshot_age_s: float | None = None
    """Seconds since then, by this member's clock (None: no snapshot)."""
    log_bytes_since_snapshot: int = 0
    """Log this member holds after its last snapshot (what a restart would replay)."""
    snapshot_log_bytes: int = 0
    """The log after the last snapshot that makes the leader take the next one:
    ``--snapshot-log-bytes``, or the last snapshot's size if more (0: off)."""
    auto_snapshots: int = 0
    """Snapshots this member asked for by itself, as leader, since it started."""

    def health(self, sees_quorum: bool | None = None) -> tuple[bool, list[str]]:
        """Whether this member can take its part in writes now, and why (or why not).

        Healthy: module ACTIVE, disk writable, not catching up, and either a ready leader
        that heard from a quorum within the heartbeat timeout (``["leader"]``) or a
        follower that heard from its leader within it (``["follows leader N"]``).
        Otherwise every reason, the most basic first: ``"suspended"`` (or ``"module state
        X"`` for any other state but ACTIVE), ``"disk full: ..."`` / ``"disk error:
        ..."``, ``"catching up"``, ``"no leader (election STATE)"``, ``"no quorum
        (...)"``.  ``sees_quorum`` overrides :attr:`sees_quorum` (the member's own live
        view); when both are None (a member too old to say) the quorum is not judged."""
        quorum = self.sees_quorum if sees_quorum is None else sees_quorum
        reasons: list[str] = []
        if self.module_state == "SUSPENDED":
            reasons.append("suspended")
        elif self.module_state != "ACTIVE":
            reasons.append(f"module state {self.module_state}")
        if self.disk.problem:
            label = self.disk.label
            problem = self.disk.problem
            reasons.append(problem if problem.startswith(label) else f"{label}: {problem}")
        if self.catching_up:
            reasons.append("catching up")
        leads = self.role == "LEADER"
        electing = self.role == "CANDIDATE" or (
            leads and self.election_state not in ("CLOSED", "INIT")  # LEADER_*: not ready
        )
        if electing or (not leads and self.leader_member_id < 0):
            reasons.append(f"no leader (election {self.election_state})")
        elif quorum is False and leads:
            heard = ", ".join(
                f"member {f.member_id} "
                + ("never" if f.last_heard_ms_ago is None else f"{f.last_heard_ms_ago} ms ago")
                for f in self.followers
            )
            reasons.append(
                "no quorum (a quorum of followers not heard from within the heartbeat "
                f"timeout{': last heard ' + heard if heard else ''})"
            )
        elif quorum is False:
            reasons.append(
                f"no quorum (leader {self.leader_member_id} not heard from within the "
                "heartbeat timeout)"
            )
        if reasons:
            return False, reasons
        return True, ["leader" if leads else f"follows leader {self.leader_member_id}"]


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def encode_body(value: Any) -> bytes:
    """JSON for an :attr:`AdminReply.body`."""
    return _json_encoder.encode(value)


def decode_status(body: bytes) -> MemberStatus:
    """A ``describe`` body as a :class:`MemberStatus`; a body of another shape is a
    ProtocolError."""
    try:
        return msgspec.json.decode(body, type=MemberStatus)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise ProtocolError(f"bad describe body: {exc}") from None


def decode_body(body: bytes) -> Any:
    """Parse an :attr:`AdminReply.body` (``None`` when empty); bad JSON is a ProtocolError."""
    if not body:
        return None
    try:
        return _json_decoder.decode(body)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ProtocolError(f"bad admin reply body: {exc}") from None

"""What ``cluster-tool`` prints: one JSON document per command, of a fixed shape
(``docs/cluster-tool.md`` lists them), and tables for people.

Every document is one JSON object.  A member that did not answer is in it with the same
keys as one that did: ``reachable`` false, ``error`` saying why and the rest null (or
empty).  Times are epoch values (seconds, or milliseconds where Triarch keeps
milliseconds) with an ISO-8601 UTC string beside them (``..._iso``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..config import MemberEndpoints
from ..protocol.admin import MemberStatus
from ..transport.tls import is_tls_problem
from ..units import format_size
from .client import Result, find_leader

STATUS_FIELDS = tuple(f.name for f in msgspec.structs.fields(MemberStatus))
"""``describe``'s per-member keys besides ``reachable`` and ``error``."""
ENTRY_KEYS = (
    "index", "recording_id", "leadership_term_id", "term_base_log_position", "log_position",
    "timestamp", "timestamp_iso", "service_id", "entry_type", "type", "valid",
)  # fmt: skip
"""A ``recording-log`` entry's keys (``timestamp`` is epoch milliseconds)."""
ERROR_KEYS = (
    "count", "first_time", "first_time_iso", "last_time", "last_time_iso", "level", "logger",
    "message",
)  # fmt: skip
"""An ``errors`` entry's keys (times are epoch seconds)."""


# ---------------------------------------------------------------------- times and tables


def iso(seconds: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC with milliseconds (``2026-11-26T21:12:13.042Z``)."""
    if seconds is None:
        return None
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_ms(milliseconds: int | None) -> str | None:
    """Epoch milliseconds (cluster time, recording-log timestamps) as ISO-8601 UTC."""
    return None if milliseconds is None else iso(milliseconds / 1000)


def short_time(seconds: float) -> str:
    """ISO-8601 UTC to the second, for tables (``2026-11-26T21:12:13Z``)."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """``45s``, ``12m03s``, ``3h07m``, ``2d04h``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def now_fields(now: float | None = None) -> dict[str, Any]:
    """``time`` (epoch seconds, when the tool asked) and ``time_iso``."""
    t = time.time() if now is None else now
    return {"time": t, "time_iso": iso(t)}


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    lines = [list(header), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True))
        + ("  " if len(row) > 1 else "")
        + row[-1]
        for row in lines
    )


def cell(value: Any) -> str:
    return "-" if value is None else str(value)


def down(error: str, word: str = "down") -> str:
    """A member that did not answer, in a table: ``"down (why)"``; a TLS mistake of ours
    (no ``--certs-dir``, the wrong one) as itself: the member may well be up."""
    return error if is_tls_problem(error) else f"{word} ({error})"


def _error(r: Result) -> str | None:
    return None if r.ok else (r.failure or "no answer")


# ---------------------------------------------------------------------- describe, health


def role_text(s: MemberStatus) -> str:
    """The role as tables show it: "FOLLOWER (catching up)" for a catch-up member."""
    return f"{s.role} (catching up)" if s.catching_up else s.role


def snapshot_text(s: MemberStatus) -> str:
    """The last snapshot as tables show it: ``"1048576 (3m02s ago)"``, or ``"-"``."""
    if s.last_snapshot_position < 0:
        return "-"
    if s.last_snapshot_age_s is None:
        return str(s.last_snapshot_position)
    return f"{s.last_snapshot_position} ({duration(s.last_snapshot_age_s)} ago)"


def describe_member(r: Result) -> dict[str, Any]:
    """One member of ``describe --output json``: every :class:`MemberStatus` field (null
    when it did not answer with one), ``reachable`` and ``error``."""
    if r.status is not None:
        fields = msgspec.to_builtins(r.status)
        return {**{k: fields.get(k) for k in STATUS_FIELDS}, "reachable": True, "error": None}
    down: dict[str, Any] = dict.fromkeys(STATUS_FIELDS)
    down["member_id"] = r.member.member_id
    return {**down, "reachable": False, "error": r.failure or "no answer"}


def describe_document(described: Sequence[Result], now: float | None = None) -> dict[str, Any]:
    """``describe --output json``: ``time``, ``time_iso``, ``leader_member_id`` (-1: none)
    and ``members``."""
    return {
        **now_fields(now),
        "leader_member_id": find_leader(described),
        "members": [describe_member(r) for r in described],
    }


def describe_table(described: Sequence[Result]) -> str:
    leader = find_leader(described)
    lag: dict[int, int | None] = {}
    for r in described:
        s = r.status
        if s is not None and s.role == "LEADER" and s.member_id == leader:
            lag[s.member_id] = 0
            for f in s.followers:
                lag[f.member_id] = f.lag_bytes
    header = (
        "member", "role", "term", "commit", "append", "snapshot", "election", "module",
        "sessions", "lag", "uptime", "pid", "archive", "version", "status",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = []
    for r in described:
        s = r.status
        if s is None:
            rows.append((str(r.member.member_id), *("-",) * 13, down(r.failure).strip()))
            continue
        rows.append(
            (
                str(s.member_id),
                role_text(s),
                str(s.leadership_term_id),
                str(s.commit_position),
                str(s.append_position),
                snapshot_text(s),
                s.election_state,
                s.module_state,
                str(len(s.sessions)),
                cell(lag.get(s.member_id)),
                duration(s.uptime_s),
                str(s.pid) if s.pid else "-",
                format_size(s.archive_bytes),
                s.version or "-",
                f"up, {s.disk.summary()}" if s.disk.problem else "up",
            )
        )
    return table(header, rows) + f"\nleader: {leader if leader >= 0 else 'none'}"


def health_member(r: Result) -> dict[str, Any]:
    """One member of ``health --output json``: ``healthy`` (it answered and can take its
    part in writes now: :meth:`MemberStatus.health`), ``role``, ``error`` (why it did not
    answer), ``reason`` (every reason, "; "-joined) and ``reasons``."""
    if r.status is None:
        error = r.failure or "no answer"
        reason = error if is_tls_problem(error) else f"down: {error}"
        return {
            "member_id": r.member.member_id,
            "reachable": r.reachable,
            "healthy": False,
            "role": None,
            "error": error,
            "reason": reason,
            "reasons": [reason],
        }
    ok, reasons = r.status.health()
    return {
        "member_id": r.member.member_id,
        "reachable": r.reachable,
        "healthy": ok,
        "role": r.status.role,
        "error": None,
        "reason": "; ".join(reasons),
        "reasons": reasons,
    }


def health_document(described: Sequence[Result], now: float | None = None) -> dict[str, Any]:
    """``health --output json``: ``healthy`` when every member answers and is healthy
    (:func:`health_member`) and exactly one leads (so that leader is ready, heard from
    a quorum, ACTIVE, with a writable disk); ``reason`` (the cluster's: "healthy", or the
    first thing wrong: "no member answered", "no leader", "2 leaders", the leader's
    reason such as "suspended", else the first problem), the leader, each member, and
    every ``problem`` in words."""
    leader = find_leader(described)
    members = [health_member(r) for r in described]
    problems = [
        m["error"]
        if m["error"] is not None and is_tls_problem(m["error"])
        else f"member {m['member_id']} down: {m['error']}"
        if m["error"] is not None
        else f"member {m['member_id']}: {m['reason']}"
        for m in members
        if not m["healthy"]
    ]
    leaders = [r.status for r in described if r.status is not None and r.status.role == "LEADER"]
    if len(leaders) > 1:
        problems.append(
            f"{len(leaders)} leaders: "
            + ", ".join(f"member {s.member_id} (term {s.leadership_term_id})" for s in leaders)
        )
    if not leaders:
        problems.append("no leader")
    by_id = {m["member_id"]: m for m in members}
    if not problems:
        reason = "healthy"
    elif all(m["error"] is not None for m in members):
        tls = [m["error"] for m in members if is_tls_problem(m["error"])]
        reason = tls[0] if tls else "no member answered"
    elif not leaders:
        reason = "no leader"
    elif len(leaders) > 1:
        reason = f"{len(leaders)} leaders"
    elif not by_id[leader]["healthy"]:
        reason = by_id[leader]["reason"]
    else:
        reason = problems[0]
    return {
        **now_fields(now),
        "healthy": not problems,
        "reason": reason,
        "leader_member_id": leader,
        "members": members,
        "problems": problems,
    }


def health_table(document: Mapping[str, Any]) -> str:
    rows = [
        (
            str(m["member_id"]),
            "healthy" if m["healthy"] else "unhealthy",
            cell(m["role"]),
            m["reason"],
        )
        for m in document["members"]
    ]
    verdict = "healthy" if document["healthy"] else "unhealthy: " + "; ".join(document["problems"])
    return table(("member", "health", "role", "reason"), rows) + f"\ncluster: {verdict}"


# ---------------------------------------------------------------------- list-members


def list_members_document(
    described: Sequence[Result], view: Result | None, now: float | None = None
) -> dict[str, Any]:
    """``list-members --output json``: the members as ``view_member_id`` sees them (the
    ``--members`` list when no member answered: ``view_member_id`` null), each with its
    endpoints, ``reachable``, ``role`` and ``error``."""
    by_id = {r.member.member_id: r for r in described}
    if view is not None and view.status is not None:
        addresses: list[Any] = list(view.status.members)
        leader = view.status.leader_member_id
        view_id: int | None = view.status.member_id
    else:
        addresses = [r.member for r in described]
        leader, view_id = find_leader(described), None
    members = []
    for a in addresses:
        r = by_id.get(a.member_id)
        members.append(
            {
                "member_id": a.member_id,
                "host": a.host,
                "ingress_port": a.ingress_port,
                "consensus_port": a.consensus_port,
                "admin_port": a.admin_port,
                "reachable": r is not None and r.status is not None,
                "role": None if r is None or r.status is None else r.status.role,
                "error": "not in --members" if r is None else _error(r),
            }
        )
    return {
        **now_fields(now),
        "leader_member_id": leader,
        "view_member_id": view_id,
        "members": members,
    }


def list_members_table(document: Mapping[str, Any]) -> str:
    header = ("member", "host", "ingress", "consensus", "admin", "role", "status")
    rows = [
        (
            str(m["member_id"]),
            m["host"],
            str(m["ingress_port"]),
            str(m["consensus_port"]),
            str(m["admin_port"]),
            cell(m["role"]),
            "up" if m["reachable"] else down(m["error"]),
        )
        for m in document["members"]
    ]
    leader = document["leader_member_id"]
    seen = document["view_member_id"]
    by = f"as member {seen} sees it" if seen is not None else "from --members"
    return table(header, rows) + f"\nleader: {leader if leader >= 0 else 'none'} ({by})"


# ---------------------------------------------------------------------- recording-log, errors


def recording_log_member(r: Result) -> dict[str, Any]:
    """``member_id``, ``reachable``, ``error`` and ``entries`` (:data:`ENTRY_KEYS`)."""
    entries: list[dict[str, Any]] = []
    if r.ok:
        for e in r.body or []:
            entry = {k: e.get(k) for k in ENTRY_KEYS}
            entry["timestamp_iso"] = iso_ms(e.get("timestamp"))
            entries.append(entry)
    return {
        "member_id": r.member.member_id,
        "reachable": r.reachable,
        "error": _error(r),
        "entries": entries,
    }


def recording_log_table(item: Mapping[str, Any]) -> str:
    header = (
        "index", "type", "term", "base position", "log position", "timestamp (UTC)",
        "service", "recording", "valid",
    )  # fmt: skip
    rows = [
        (
            cell(e["index"]),
            cell(e["type"]),
            cell(e["leadership_term_id"]),
            cell(e["term_base_log_position"]),
            cell(e["log_position"]),
            cell(e["timestamp_iso"]),
            cell(e["service_id"]),
            cell(e["recording_id"]),
            "yes" if e["valid"] else "no",
        )
        for e in item["entries"]
    ]
    return table(header, rows)


def errors_member(r: Result) -> dict[str, Any]:
    """``member_id``, ``reachable``, ``error``, ``now`` (what is wrong now: a full disk;
    null when nothing), ``distinct``, ``evicted``, ``total`` and ``errors``
    (:data:`ERROR_KEYS`, the one seen most recently last)."""
    item: dict[str, Any] = {
        "member_id": r.member.member_id,
        "reachable": r.reachable,
        "error": _error(r),
        "now": None,
        "distinct": None,
        "evicted": None,
        "total": None,
        "errors": [],
    }
    if not r.ok or r.reply is None:
        return item
    body = r.body
    records = body.get("entries", []) if isinstance(body, dict) else body or []
    if isinstance(body, dict):  # a node with the distinct log
        item.update(distinct=body.get("distinct"), evicted=body.get("evicted"))
        item["total"] = body.get("total")
    item["now"] = r.reply.message or None
    for rec in records:
        last = rec.get("last_time", rec.get("time"))
        first = rec.get("first_time", last)
        item["errors"].append(
            {
                "count": rec.get("count", 1),
                "first_time": first,
                "first_time_iso": iso(first),
                "last_time": last,
                "last_time_iso": iso(last),
                "level": rec.get("level"),
                "logger": rec.get("logger"),
                "message": rec.get("message"),
            }
        )
    if item["distinct"] is None:
        item["distinct"] = len(records)
    return item


def errors_table(item: Mapping[str, Any]) -> str:
    """count, first, last, level, logger and the message's first line (the rest, such as
    a traceback, is in ``--output json``)."""
    rows = []
    for e in item["errors"]:
        lines = str(e["message"] or "").splitlines() or [""]
        more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        rows.append(
            (
                str(e["count"]),
                short_time(e["first_time"]) if e["first_time"] is not None else "-",
                short_time(e["last_time"]) if e["last_time"] is not None else "-",
                cell(e["level"]),
                cell(e["logger"]),
                lines[0] + more,
            )
        )
    return table(("count", "first (UTC)", "last (UTC)", "level", "logger", "message"), rows)


# ---------------------------------------------------------------------- actions


def action_document(
    command: str, member_id: int | None, ok: bool, message: str, body: Any = None
) -> dict[str, Any]:
    """A cluster action's answer: ``command``, ``member_id`` (null when no member was
    asked), ``ok``, ``message`` and ``body`` (snapshot: ``log_position`` and
    ``leadership_term_id``; else null)."""
    return {
        "command": command,
        "member_id": member_id,
        "ok": ok,
        "message": message,
        "body": body if body else None,
    }


def invalidate_member(r: Result) -> dict[str, Any]:
    """``member_id``, ``reachable``, ``ok``, ``invalidated`` (null unless ``ok``),
    ``message`` and ``error``."""
    body = r.body if r.ok else None
    return {
        "member_id": r.member.member_id,
        "reachable": r.reachable,
        "ok": r.ok,
        "invalidated": bool(body.get("invalidated")) if isinstance(body, dict) else None,
        "message": r.reply.message if r.reply is not None else None,
        "error": _error(r),
    }


def certs_document(out: str, folders: Sequence[Any], created: set[Any]) -> dict[str, Any]:
    """``certs --output json``: ``out`` and each ``folders`` entry's ``path`` and
    ``created`` (false: it was there already and is kept)."""
    return {
        "out": out,
        "folders": [{"path": str(f), "created": f in created} for f in folders],
    }


def member_tag(member: MemberEndpoints | int) -> str:
    member_id = member if isinstance(member, int) else member.member_id
    return f"Member [{member_id}]"

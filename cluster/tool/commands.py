"""``cluster-tool``'s commands: each asks the members, prints a table or its JSON
document (:mod:`cluster.tool.render`) and returns the exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..config import MemberEndpoints
from ..protocol.admin import decode_body
from ..transport.tls import is_tls_problem
from . import loop, render
from .client import Result, Unreachable, describe_all, find_leader, request, request_all

ACTIONS = ("snapshot", "suspend", "resume", "shutdown", "abort", "transfer-leadership", "stop")


@dataclass
class Options:
    members: list[MemberEndpoints]
    output: str = "table"
    timeout: float = 2.0
    snapshot_timeout: float = 30.0
    member: int | None = None
    limit: int | None = None
    to: int | None = None
    """``transfer-leadership --to``: the member to hand leadership to."""

    @property
    def json(self) -> bool:
        return self.output == "json"

    def selected(self) -> list[MemberEndpoints]:
        if self.member is None:
            return self.members
        return [m for m in self.members if m.member_id == self.member]


def emit(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _tag(member_id: int) -> str:
    return render.member_tag(member_id)


async def cmd_describe(opts: Options) -> int:
    """Every member's status; exit 1 unless every member (or ``--member``) answered."""
    described = await describe_all(opts.selected(), opts.timeout)
    if opts.json:
        emit(render.describe_document(described))
    else:
        print(render.describe_table(described))
    return 0 if all(r.status is not None for r in described) else 1


async def cmd_health(opts: Options) -> int:
    """``health`` (etcdctl endpoint health): every member answers and is healthy, and
    exactly one leads, ready, with a quorum, ACTIVE, its disk writable; exit 0, else 1
    with each member's reason (:func:`render.health_document`)."""
    document = render.health_document(await describe_all(opts.members, opts.timeout))
    if opts.json:
        emit(document)
    else:
        print(render.health_table(document))
    return 0 if document["healthy"] else 1


async def cmd_list_members(opts: Options) -> int:
    """The members as the leader (or ``--member``) sees them; exit 1 when it (or every
    member) did not answer."""
    described = await describe_all(opts.members, opts.timeout)
    by_id = {r.member.member_id: r for r in described}
    chosen = opts.member if opts.member is not None else find_leader(described)
    if chosen < 0:  # no leader: the first member that answers
        chosen = next((r.member.member_id for r in described if r.status is not None), -1)
    view = by_id.get(chosen)
    if view is not None and view.status is None:
        view = None
    document = render.list_members_document(described, view)
    if opts.json:
        emit(document)
    else:
        print(render.list_members_table(document))
    if view is None:
        failure = by_id[chosen].failure if chosen in by_id else "no member answered"
        print(f"list-members: {_tag(chosen) + ': ' if chosen >= 0 else ''}{failure}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _query_exit(opts: Options, results: list[Result]) -> int:
    failed = sum(not r.ok for r in results)
    if opts.member is not None:
        return 1 if failed else 0
    return 1 if failed == len(results) else 0


def _member_heading(item: dict[str, Any], what: tuple[str, str], count: int) -> str:
    if item["error"] is not None:
        state = "unreachable" if not item["reachable"] else "refused"
        return f"{_tag(item['member_id'])}: {render.down(item['error'], state)}"
    return f"{_tag(item['member_id'])}: {count} {what[0] if count == 1 else what[1]}"


async def cmd_recording_log(opts: Options) -> int:
    results = await request_all(opts.selected(), "recording-log", {}, opts.timeout)
    items = [render.recording_log_member(r) for r in results]
    if opts.json:
        emit({**render.now_fields(), "members": items})
    else:
        for i, item in enumerate(items):
            print(
                ("\n" if i else "")
                + _member_heading(item, ("entry", "entries"), len(item["entries"]))
            )
            if item["entries"]:
                print(_indent(render.recording_log_table(item)))
    return _query_exit(opts, results)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


_ERRORS = ("distinct error", "distinct errors")


async def cmd_errors(opts: Options) -> int:
    args = {"summary": "1"}
    if opts.limit is not None:
        args["limit"] = str(opts.limit)
    results = await request_all(opts.selected(), "errors", args, opts.timeout)
    items = [render.errors_member(r) for r in results]
    if opts.json:
        emit({**render.now_fields(), "members": items})
    else:
        for i, item in enumerate(items):
            errors = item["errors"]
            heading = _member_heading(item, _ERRORS, item["distinct"] or 0)
            if item["error"] is None and item["evicted"]:
                heading += f" ({item['evicted']} older ones evicted)"
            print(("\n" if i else "") + heading)
            if item["now"]:
                print(f"  NOW: {item['now']}")
            if errors:
                print(_indent(render.errors_table(item)))
    return _query_exit(opts, results)


async def cmd_action(opts: Options, command: str) -> int:
    """A cluster action, sent to the leader (found with ``describe``) or ``--member``."""

    def done(member_id: int | None, ok: bool, message: str, body: Any = None) -> int:
        if opts.json:
            emit(render.action_document(command, member_id, ok, message, body))
        elif member_id is None:
            print(f"{command}: {message}", file=sys.stderr)
        else:
            print(f"{_tag(member_id)}: {message}", file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1

    target = opts.member
    if target is None:
        described = await describe_all(opts.members, opts.timeout)
        target = find_leader(described)
        if target < 0:
            tls = [r.failure for r in described if is_tls_problem(r.failure)]
            down = [r.member.member_id for r in described if not r.reachable]
            why = f" ({tls[0]})" if tls else f" (unreachable: {down})" if down else ""
            return done(None, False, "no leader found" + why)
    member = next(m for m in opts.members if m.member_id == target)
    args: dict[str, str] = {}
    timeout = opts.timeout
    if command == "snapshot":
        args["timeout"] = f"{opts.snapshot_timeout:g}"
        timeout += opts.snapshot_timeout
    elif command == "transfer-leadership":
        if opts.to is not None:
            args["to"] = str(opts.to)
        timeout += 15.0  # the leader waits for the hand-over: an election timeout or so
    try:
        reply = await request(member, command, args, timeout)
    except Unreachable as exc:
        return done(target, False, render.down(str(exc), "unreachable"))
    body = decode_body(reply.body) if reply.ok and reply.body else None
    message = reply.message
    if not opts.json and isinstance(body, dict) and "log_position" in body:
        message += (
            f" (log position {body['log_position']}, leadership term {body['leadership_term_id']})"
        )
    return done(target, reply.ok, message, body)


async def cmd_invalidate(opts: Options) -> int:
    results = await request_all(opts.selected(), "invalidate-latest-snapshot", {}, opts.timeout)
    items = [render.invalidate_member(r) for r in results]
    if opts.json:
        emit({"members": items})
    else:
        for item in items:
            if item["ok"]:
                print(f"{_tag(item['member_id'])}: {item['message']}")
            else:
                print(f"{_tag(item['member_id'])}: {item['error']}", file=sys.stderr)
    return 0 if all(item["ok"] for item in items) else 1


async def cmd_timings(opts: Options) -> int:
    """Each member's fsync, duty-cycle, commit and replication times; exit 1 unless
    every member (or ``--member``) answered."""
    described = await describe_all(opts.selected(), opts.timeout)
    items = [loop.timings_member(r) for r in described]
    if opts.json:
        emit({**render.now_fields(), "members": items})
    else:
        print(loop.timings_table(items))
    return 0 if all(r.status is not None for r in described) else 1


async def cmd_stalls(opts: Options) -> int:
    """Each member's event-loop stalls (the most recent ones, with what ran)."""
    described = await describe_all(opts.selected(), opts.timeout)
    items = [loop.stalls_member(r) for r in described]
    if opts.json:
        emit({**render.now_fields(), "members": items})
    else:
        for i, item in enumerate(items):
            print(("\n" if i else "") + loop.stalls_heading(item))
            if item["recent"]:
                print(_indent(loop.stalls_table(item)))
    return 0 if all(r.status is not None for r in described) else 1


async def cmd_is_leader(opts: Options) -> int:
    """``is-leader --member N`` (Aeron's ClusterTool ``is-leader``): exit 0 when N
    leads, else 1 (a line says what it is, or why it did not answer)."""
    (result,) = await describe_all(opts.selected(), opts.timeout)
    s = result.status
    leads = s is not None and s.role == "LEADER" and s.leader_member_id == s.member_id
    if opts.json:
        emit({
            "member_id": result.member.member_id,
            "is_leader": leads,
            "role": None if s is None else s.role,
            "leader_member_id": None if s is None else s.leader_member_id,
            "leadership_term_id": None if s is None else s.leadership_term_id,
            "error": result.error or None,
        })  # fmt: skip
    elif s is None:
        print(f"{_tag(result.member.member_id)}: {render.down(result.error, 'unreachable')}")
    elif leads:
        print(f"{_tag(s.member_id)} leads term {s.leadership_term_id}")
    else:
        known = f"member {s.leader_member_id}" if s.leader_member_id >= 0 else "none known"
        print(f"{_tag(s.member_id)} is {render.role_text(s)}, not the leader (leader: {known})")
    return 0 if leads else 1


QUERIES: dict[str, Callable[[Options], Awaitable[int]]] = {
    "describe": cmd_describe,
    "health": cmd_health,
    "list-members": cmd_list_members,
    "recording-log": cmd_recording_log,
    "errors": cmd_errors,
    "timings": cmd_timings,
    "stalls": cmd_stalls,
    "is-leader": cmd_is_leader,
    "invalidate-latest-snapshot": cmd_invalidate,
}


async def run(opts: Options, command: str) -> int:
    query = QUERIES.get(command)
    if query is not None:
        return await query(opts)
    return await cmd_action(opts, command)

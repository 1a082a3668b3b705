"""``cluster-tool``: query and control a running cluster through its members' admin ports.

Usage::

    cluster-tool --members 0=host:ingress:consensus:admin,1=... [--json] [--timeout 2s] \\
        COMMAND [--member N]

Queries: ``describe`` (every member, as a table or ``--json``), ``list-members``,
``recording-log``, ``errors``.  Cluster actions (sent to the leader, found through
``describe``, or to ``--member N``): ``snapshot``, ``suspend``, ``resume``, ``shutdown``
(snapshot, then every member stops), ``abort`` (every member stops, no snapshot).
``invalidate-latest-snapshot`` edits the recording log of ``--member N`` or of every
member.  Members only accept the cluster actions and ``invalidate-latest-snapshot`` from
a loopback address, so run the tool on a member's host.

Unreachable members are shown as down.  Exit codes: 0 success, 1 a command refused or
failed (or no member answered), 2 usage errors.  ``--members`` defaults to
``$CLUSTER_MEMBERS``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import trio

from .config import MemberEndpoints, UsageParser, duration_seconds
from .protocol.admin import AdminCommand, AdminReply, decode_body
from .protocol.codec import ADMIN
from .protocol.errors import ProtocolError
from .protocol.framing import FrameDecoder, encode_frame

QUERIES = ("describe", "list-members", "recording-log", "errors")
ACTIONS = ("snapshot", "suspend", "resume", "shutdown", "abort")
COMMANDS = (*QUERIES, *ACTIONS, "invalidate-latest-snapshot")
MAX_REPLY_SIZE = 64 << 20

_correlation_ids = itertools.count(1)


class Unreachable(Exception):
    """The member did not answer (refused, timed out, closed, bad bytes)."""


@dataclass
class Result:
    member: MemberEndpoints
    reply: AdminReply | None = None
    error: str = ""

    @property
    def reachable(self) -> bool:
        return self.reply is not None

    @property
    def body(self) -> Any:
        return decode_body(self.reply.body) if self.reply is not None else None


async def request(
    member: MemberEndpoints, command: str, args: dict[str, str], limit: float
) -> AdminReply:
    """Send one command to ``member``'s admin port and wait for its reply."""
    correlation_id = next(_correlation_ids)
    try:
        with trio.fail_after(limit):
            stream = await trio.open_tcp_stream(member.host, member.admin_port)
            async with stream:
                await stream.send_all(encode_frame(AdminCommand(correlation_id, command, args)))
                decoder = FrameDecoder(MAX_REPLY_SIZE)
                while True:
                    data = await stream.receive_some(256 * 1024)
                    if not data:
                        raise Unreachable("connection closed before a reply")
                    for body in decoder.feed(data):
                        reply = ADMIN.decode(body)
                        if isinstance(reply, AdminReply) and reply.correlation_id in (
                            correlation_id,
                            -1,
                        ):
                            return reply
    except trio.TooSlowError:
        raise Unreachable(f"no reply within {limit:g}s") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise Unreachable(str(exc) or type(exc).__name__) from None
    except ProtocolError as exc:
        raise Unreachable(f"bad reply: {exc}") from None


async def request_all(
    members: Sequence[MemberEndpoints], command: str, args: dict[str, str], limit: float
) -> list[Result]:
    """``command`` to every member at once; unreachable members are results with an error."""
    results = [Result(m) for m in members]

    async def one(result: Result) -> None:
        try:
            result.reply = await request(result.member, command, args, limit)
        except Unreachable as exc:
            result.error = str(exc)

    async with trio.open_nursery() as nursery:
        for result in results:
            nursery.start_soon(one, result)
    return results


# ---------------------------------------------------------------------- describe


def find_leader(described: Sequence[Result]) -> int:
    """The leader's member id from ``describe`` results (-1 if there is none)."""
    bodies = [r.body for r in described if r.reply is not None and r.reply.ok]
    leaders = [b for b in bodies if isinstance(b, dict) and b.get("role") == "LEADER"]
    if leaders:
        return int(max(leaders, key=lambda b: b["leadership_term_id"])["member_id"])
    return -1


def describe_document(described: Sequence[Result]) -> dict[str, Any]:
    members: list[dict[str, Any]] = []
    for r in described:
        if r.reachable and r.reply is not None and r.reply.ok:
            members.append({**r.body, "reachable": True})
        else:
            error = r.error or (r.reply.message if r.reply is not None else "")
            members.append({"member_id": r.member.member_id, "reachable": False, "error": error})
    return {"members": members, "leader_member_id": find_leader(described)}


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def describe_table(document: dict[str, Any]) -> str:
    lag: dict[int, int | None] = {}
    for m in document["members"]:
        if m.get("role") == "LEADER" and m["member_id"] == document["leader_member_id"]:
            lag[m["member_id"]] = 0
            for f in m.get("followers", []):
                lag[f["member_id"]] = f["lag_bytes"]
    header = (
        "member", "role", "term", "commit", "append", "election", "module", "sessions", "lag",
        "status",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for m in document["members"]:
        if not m["reachable"]:
            rows.append((str(m["member_id"]), *("-",) * 8, f"down ({m.get('error', '')})".strip()))
            continue
        rows.append(
            (
                str(m["member_id"]),
                m["role"],
                str(m["leadership_term_id"]),
                str(m["commit_position"]),
                str(m["append_position"]),
                m["election_state"],
                m["module_state"],
                str(len(m["sessions"])),
                _cell(lag.get(m["member_id"])),
                "up",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
    leader = document["leader_member_id"]
    lines.append(f"leader: {leader if leader >= 0 else 'none'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- commands


@dataclass
class Options:
    members: list[MemberEndpoints]
    json: bool
    timeout: float
    snapshot_timeout: float
    member: int | None

    def selected(self) -> list[MemberEndpoints]:
        if self.member is None:
            return self.members
        return [m for m in self.members if m.member_id == self.member]


def emit(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def _tag(member_id: int) -> str:
    return f"Member [{member_id}]"


async def cmd_describe(opts: Options) -> int:
    described = await request_all(opts.selected(), "describe", {}, opts.timeout)
    document = describe_document(described)
    if opts.json:
        emit(document)
    else:
        print(describe_table(document))
    return 0 if any(m["reachable"] for m in document["members"]) else 1


async def cmd_list_members(opts: Options) -> int:
    described = await request_all(opts.members, "describe", {}, opts.timeout)
    leader = find_leader(described)
    by_id = {r.member.member_id: r for r in described}
    chosen = opts.member if opts.member is not None else leader
    if chosen < 0:
        chosen = next((r.member.member_id for r in described if r.reachable), -1)
    result = by_id.get(chosen)
    if result is None or not result.reachable or result.reply is None or not result.reply.ok:
        print("timeout waiting for response from node", file=sys.stderr)
        return 1
    view = result.body
    up = {r.member.member_id for r in described if r.reachable}
    members = view["members"]
    if opts.json:
        emit(
            {
                "current_time_ns": time.time_ns(),
                "leader_member_id": view["leader_member_id"],
                "member_id": view["member_id"],
                "active_members": [{**m, "reachable": m["member_id"] in up} for m in members],
                "passive_members": [],
            }
        )
        return 0
    active = ", ".join(
        f"ClusterMember{{id={m['member_id']}, endpoints={m['host']}:{m['ingress_port']}:"
        f"{m['consensus_port']}:{m['admin_port']}, {'up' if m['member_id'] in up else 'down'}}}"
        for m in members
    )
    print(
        f"currentTimeNs={time.time_ns()}, leaderMemberId={view['leader_member_id']}, "
        f"memberId={view['member_id']}, activeMembers=[{active}], passiveMembers=[]"
    )
    return 0


def _entry_text(e: dict[str, Any]) -> str:
    return (
        f"Entry{{recordingId={e['recording_id']}, leadershipTermId={e['leadership_term_id']}, "
        f"termBaseLogPosition={e['term_base_log_position']}, logPosition={e['log_position']}, "
        f"timestamp={e['timestamp']}, serviceId={e['service_id']}, type={e['type']}, "
        f"isValid={str(e['valid']).lower()}, entryIndex={e['index']}}}"
    )


def _error_text(e: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(e["time"]).isoformat(sep=" ", timespec="milliseconds")
    return f"{when} {e['level']} {e['logger']}: {e['message']}"


async def _per_member_query(
    opts: Options, command: str, key: str, fmt: Callable[[dict[str, Any]], str]
) -> int:
    args = {"limit": "200"} if command == "errors" else {}
    results = await request_all(opts.selected(), command, args, opts.timeout)
    document: list[dict[str, Any]] = []
    failed = 0
    for r in results:
        member_id = r.member.member_id
        if r.reply is None or not r.reply.ok:
            failed += 1
            error = r.error or (r.reply.message if r.reply is not None else "")
            document.append({"member_id": member_id, "reachable": r.reply is not None,
                             "error": error})  # fmt: skip
            if not opts.json:
                print(f"{_tag(member_id)}: unreachable ({error})")
            continue
        items = r.body or []
        document.append({"member_id": member_id, "reachable": True, key: items})
        if not opts.json:
            print(f"{_tag(member_id)}: {len(items)} {key.replace('_', ' ')}")
            for item in items:
                print(f"  {fmt(item)}")
    if opts.json:
        emit({"members": document})
    if opts.member is not None:
        return 1 if failed else 0
    return 1 if failed == len(results) else 0


async def cmd_recording_log(opts: Options) -> int:
    return await _per_member_query(opts, "recording-log", "entries", _entry_text)


async def cmd_errors(opts: Options) -> int:
    return await _per_member_query(opts, "errors", "errors", _error_text)


async def cmd_action(opts: Options, command: str) -> int:
    target = opts.member
    if target is None:
        described = await request_all(opts.members, "describe", {}, opts.timeout)
        target = find_leader(described)
        if target < 0:
            down = [r.member.member_id for r in described if not r.reachable]
            message = "no leader found" + (f" (unreachable: {down})" if down else "")
            if opts.json:
                emit({"member_id": None, "ok": False, "message": message})
            else:
                print(f"{command}: {message}", file=sys.stderr)
            return 1
    member = next(m for m in opts.members if m.member_id == target)
    args: dict[str, str] = {}
    timeout = opts.timeout
    if command == "snapshot":
        args["timeout"] = f"{opts.snapshot_timeout:g}"
        timeout += opts.snapshot_timeout
    try:
        reply = await request(member, command, args, timeout)
    except Unreachable as exc:
        message = f"unreachable ({exc})"
        if opts.json:
            emit({"member_id": target, "ok": False, "message": message})
        else:
            print(f"{_tag(target)}: {message}", file=sys.stderr)
        return 1
    body = decode_body(reply.body) if reply.ok else None
    if opts.json:
        emit({"member_id": target, "ok": reply.ok, "message": reply.message, "body": body})
    elif reply.ok:
        extra = ""
        if isinstance(body, dict) and "log_position" in body:
            extra = (
                f" (log position {body['log_position']}, "
                f"leadership term {body['leadership_term_id']})"
            )
        print(f"{_tag(target)}: {reply.message}{extra}")
    else:
        print(f"{_tag(target)}: {reply.message}", file=sys.stderr)
    return 0 if reply.ok else 1


async def cmd_invalidate(opts: Options) -> int:
    results = await request_all(opts.selected(), "invalidate-latest-snapshot", {}, opts.timeout)
    document = []
    failed = False
    for r in results:
        member_id = r.member.member_id
        if r.reply is None or not r.reply.ok:
            failed = True
            message = r.error or (r.reply.message if r.reply is not None else "")
            document.append({"member_id": member_id, "ok": False, "message": message})
            if not opts.json:
                print(f"{_tag(member_id)}: {message}", file=sys.stderr)
            continue
        body = r.body or {}
        document.append(
            {"member_id": member_id, "ok": True, "invalidated": bool(body.get("invalidated"))}
        )
        if not opts.json:
            print(f"{_tag(member_id)}: {r.reply.message}")
    if opts.json:
        emit({"members": document})
    return 1 if failed else 0


async def run(opts: Options, command: str) -> int:
    if command == "describe":
        return await cmd_describe(opts)
    if command == "list-members":
        return await cmd_list_members(opts)
    if command == "recording-log":
        return await cmd_recording_log(opts)
    if command == "errors":
        return await cmd_errors(opts)
    if command == "invalidate-latest-snapshot":
        return await cmd_invalidate(opts)
    return await cmd_action(opts, command)


# ---------------------------------------------------------------------- CLI


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-tool",
        description="Query and control a Triarch cluster through its members' admin ports.",
        epilog=(
            "commands: describe, list-members, recording-log, errors (queries); snapshot, "
            "suspend, resume, shutdown, abort (sent to the leader, or to --member); "
            "invalidate-latest-snapshot (--member N or every member).  Exit codes: 0 ok, "
            "1 refused or failed, 2 usage."
        ),
    )
    parser.add_argument(
        "--members",
        default=os.environ.get("CLUSTER_MEMBERS", ""),
        help="0=host:ingress:consensus:admin,1=... (default: $CLUSTER_MEMBERS)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--timeout",
        type=duration_seconds,
        default=2.0,
        help="per-member reply timeout (default 2s)",
    )
    parser.add_argument(
        "--snapshot-timeout",
        type=duration_seconds,
        default=30.0,
        help="how long snapshot waits for the snapshot to be taken (default 30s)",
    )
    parser.add_argument("--member", type=int, default=None, help="only this member")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=", ".join(COMMANDS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    members = parser.members(args.members)
    if args.member is not None and args.member not in {m.member_id for m in members}:
        parser.error(f"--member {args.member} is not in --members")
    opts = Options(members, args.json, args.timeout, args.snapshot_timeout, args.member)
    try:
        return trio.run(run, opts, args.command)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

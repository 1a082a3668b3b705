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

``certs --out DIR [--client NAME ...] [--days N]`` needs no running cluster: it makes the
cluster's certificates (:mod:`cluster.certs`) for the members of ``--members`` in ``DIR``,
reusing the CA already there and keeping the folders already made.

``describe`` answers are decoded with their type
(:class:`~cluster.protocol.admin.MemberStatus`); a member whose answer is not one is
reported with that error.  Unreachable members are shown as down.  Exit codes: 0
success, 1 a command refused or failed (or no member answered), 2 usage errors.
``--members`` defaults to ``$CLUSTER_MEMBERS``.
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
from pathlib import Path
from typing import Any

import msgspec
import trio

from .certs import DEFAULT_DAYS, make_certs, planned_folders
from .config import MemberEndpoints, UsageParser, add_version, duration_seconds
from .protocol.admin import AdminCommand, AdminReply, MemberStatus, decode_body, decode_status
from .protocol.codec import ADMIN
from .protocol.errors import ProtocolError
from .protocol.framing import FrameDecoder, encode_frame
from .transport.tcp import TcpNetwork
from .transport.tls import TlsError, load_identity

QUERIES = ("describe", "health", "list-members", "recording-log", "errors")
ACTIONS = ("snapshot", "suspend", "resume", "shutdown", "abort")
COMMANDS = (*QUERIES, *ACTIONS, "invalidate-latest-snapshot", "certs")
MAX_REPLY_SIZE = 64 << 20

_correlation_ids = itertools.count(1)


class Unreachable(Exception):
    """The member did not answer (refused, timed out, closed, bad bytes)."""


@dataclass
class Result:
    member: MemberEndpoints
    reply: AdminReply | None = None
    error: str = ""
    status: MemberStatus | None = None
    """A ``describe`` answer, decoded (see :meth:`decode_describe`)."""

    @property
    def reachable(self) -> bool:
        return self.reply is not None

    @property
    def failure(self) -> str:
        """Why there is no answer: the network error, the refusal, or a bad describe body."""
        return self.error or (self.reply.message if self.reply is not None else "")

    def decode_describe(self) -> None:
        """Decode an accepted ``describe`` answer into ``status``; a body that is not a
        :class:`MemberStatus` leaves ``status`` unset and becomes this member's ``error``."""
        if self.reply is None or not self.reply.ok:
            return
        try:
            self.status = decode_status(self.reply.body)
        except ProtocolError as exc:
            self.error = str(exc)

    @property
    def body(self) -> Any:
        return decode_body(self.reply.body) if self.reply is not None else None


_network = TcpNetwork()
"""How the tool reaches admin ports (mutual TLS with ``--certs-dir``)."""


def use_certs(folder: str | None) -> None:
    global _network
    _network = TcpNetwork(tls=None if folder is None else load_identity(Path(folder)))


async def request(
    member: MemberEndpoints, command: str, args: dict[str, str], limit: float
) -> AdminReply:
    """Send one command to ``member``'s admin port and wait for its reply."""
    correlation_id = next(_correlation_ids)
    try:
        with trio.fail_after(limit):
            stream = await _network.open_stream(member.host, member.admin_port)
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


async def describe_all(members: Sequence[MemberEndpoints], limit: float) -> list[Result]:
    """``describe`` every member, each answer decoded (:meth:`Result.decode_describe`)."""
    results = await request_all(members, "describe", {}, limit)
    for r in results:
        r.decode_describe()
    return results


def find_leader(described: Sequence[Result]) -> int:
    """The leader's member id from ``describe`` results (-1 if there is none)."""
    leaders = [r.status for r in described if r.status is not None and r.status.role == "LEADER"]
    if leaders:
        return max(leaders, key=lambda s: s.leadership_term_id).member_id
    return -1


def describe_document(described: Sequence[Result]) -> dict[str, Any]:
    """``describe --json``: every member's status (``reachable`` true) or its error."""
    members: list[dict[str, Any]] = []
    for r in described:
        if r.status is not None:
            members.append({**msgspec.to_builtins(r.status), "reachable": True})
        else:
            members.append(
                {"member_id": r.member.member_id, "reachable": False, "error": r.failure}
            )
    return {"members": members, "leader_member_id": find_leader(described)}


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


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
        "member", "role", "term", "commit", "append", "election", "module", "sessions", "lag",
        "status",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for r in described:
        s = r.status
        if s is None:
            rows.append((str(r.member.member_id), *("-",) * 8, f"down ({r.failure})".strip()))
            continue
        rows.append(
            (
                str(s.member_id),
                s.role,
                str(s.leadership_term_id),
                str(s.commit_position),
                str(s.append_position),
                s.election_state,
                s.module_state,
                str(len(s.sessions)),
                _cell(lag.get(s.member_id)),
                f"up, {s.disk.summary()}" if s.disk.problem else "up",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
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
    described = await describe_all(opts.selected(), opts.timeout)
    if opts.json:
        emit(describe_document(described))
    else:
        print(describe_table(described))
    return 0 if any(r.status is not None for r in described) else 1


async def cmd_health(opts: Options) -> int:
    """``health`` (etcdctl endpoint health): every member answers and one leads; exit 0,
    else 1 with what is wrong."""
    described = await describe_all(opts.members, opts.timeout)
    leader = find_leader(described)
    members: list[dict[str, Any]] = [
        {
            "member_id": r.member.member_id,
            "healthy": r.status is not None,
            "role": None if r.status is None else r.status.role,
            "error": r.failure if r.status is None else "",
        }
        for r in described
    ]
    problems = [f"member {m['member_id']} down: {m['error']}" for m in members if not m["healthy"]]
    if leader < 0:
        problems.append("no leader")
    healthy = not problems
    if opts.json:
        emit(
            {
                "healthy": healthy,
                "leader_member_id": leader,
                "members": members,
                "problems": problems,
            }
        )
    else:
        for m in members:
            state = f"healthy, {m['role']}" if m["healthy"] else f"unhealthy: {m['error']}"
            print(f"{_tag(m['member_id'])}: {state}")
        print("cluster: healthy" if healthy else "cluster: unhealthy: " + "; ".join(problems))
    return 0 if healthy else 1


async def cmd_list_members(opts: Options) -> int:
    described = await describe_all(opts.members, opts.timeout)
    leader = find_leader(described)
    by_id = {r.member.member_id: r for r in described}
    chosen = opts.member if opts.member is not None else leader
    if chosen < 0:
        chosen = next((r.member.member_id for r in described if r.reachable), -1)
    result = by_id.get(chosen)
    if result is None or result.reply is None or not result.reply.ok:
        print("timeout waiting for response from node", file=sys.stderr)
        return 1
    view = result.status
    if view is None:  # it answered, but not with a MemberStatus
        print(f"{_tag(chosen)}: {result.failure}", file=sys.stderr)
        return 1
    up = {r.member.member_id for r in described if r.reachable}
    if opts.json:
        emit(
            {
                "current_time_ns": time.time_ns(),
                "leader_member_id": view.leader_member_id,
                "member_id": view.member_id,
                "active_members": [
                    {**msgspec.to_builtins(m), "reachable": m.member_id in up} for m in view.members
                ],
                "passive_members": [],
            }
        )
        return 0
    active = ", ".join(
        f"ClusterMember{{id={m.member_id}, endpoints={m.host}:{m.ingress_port}:"
        f"{m.consensus_port}:{m.admin_port}, {'up' if m.member_id in up else 'down'}}}"
        for m in view.members
    )
    print(
        f"currentTimeNs={time.time_ns()}, leaderMemberId={view.leader_member_id}, "
        f"memberId={view.member_id}, activeMembers=[{active}], passiveMembers=[]"
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
        if command == "errors":  # what is wrong now (a full disk), not only its history
            document[-1]["now"] = r.reply.message
        if not opts.json:
            print(f"{_tag(member_id)}: {len(items)} {key.replace('_', ' ')}")
            if r.reply.message:
                print(f"  NOW: {r.reply.message}")
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
        described = await describe_all(opts.members, opts.timeout)
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
    if command == "health":
        return await cmd_health(opts)
    if command == "recording-log":
        return await cmd_recording_log(opts)
    if command == "errors":
        return await cmd_errors(opts)
    if command == "invalidate-latest-snapshot":
        return await cmd_invalidate(opts)
    return await cmd_action(opts, command)


def cmd_certs(parser: UsageParser, members: Sequence[MemberEndpoints], args: Any) -> int:
    """``certs``: make the cluster's certificates; one line per folder made or kept."""
    if not args.out:
        parser.error("certs needs --out DIR")
    if args.days <= 0:
        parser.error(f"--days must be positive, not {args.days}")
    pairs = [(m.member_id, m.host) for m in members]
    try:
        folders = planned_folders(args.out, pairs, args.client)
        created = set(make_certs(args.out, pairs, args.client, args.days))
    except ValueError as exc:
        print(f"{parser.prog} certs: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = exc.filename or args.out
        print(f"{parser.prog} certs: error: cannot write {where}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    for folder in folders:
        print(f"{'created' if folder in created else 'kept':<8}{folder}")
    return 0


# ---------------------------------------------------------------------- CLI


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-tool",
        description="Query and control a Triarch cluster through its members' admin ports.",
        epilog=(
            "commands: describe, health, list-members, recording-log, errors (queries); snapshot, "
            "suspend, resume, shutdown, abort (sent to the leader, or to --member); "
            "invalidate-latest-snapshot (--member N or every member); certs --out DIR "
            "[--client NAME ...] (makes the cluster's certificates, no cluster needed).  "
            "Exit codes: 0 ok, 1 refused or failed, 2 usage."
        ),
    )
    add_version(parser)
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
    parser.add_argument(
        "--out", type=Path, default=None, help="certs: the directory of the certificates"
    )
    parser.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="NAME",
        help="certs: a client principal besides admin and app (repeatable)",
    )
    parser.add_argument(
        "--days",
        type=int,
        default=DEFAULT_DAYS,
        help=f"certs: how long the certificates are valid (default {DEFAULT_DAYS} days)",
    )
    parser.add_argument(
        "--certs-dir",
        default=os.environ.get("CLUSTER_CERTS_DIR"),
        help="a client-<NAME> folder from `cluster-tool certs`, for a cluster with TLS; "
        "control commands need an admin principal (default: $CLUSTER_CERTS_DIR)",
    )
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=", ".join(COMMANDS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    members = parser.members(args.members)
    if args.command == "certs":
        return cmd_certs(parser, members, args)
    if args.member is not None and args.member not in {m.member_id for m in members}:
        parser.error(f"--member {args.member} is not in --members")
    try:
        use_certs(args.certs_dir)
    except TlsError as exc:
        parser.error(f"--certs-dir: {exc}")
    opts = Options(members, args.json, args.timeout, args.snapshot_timeout, args.member)
    try:
        return trio.run(run, opts, args.command)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

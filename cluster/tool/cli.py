"""``cluster-tool``'s command line: one subcommand each, with its own ``--help``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio

from ..certs import DEFAULT_DAYS, make_certs, planned_folders
from ..cli import (
    CLIENT_CERTS_VARIABLE,
    UsageParser,
    add_members,
    add_version,
    duration_seconds,
)
from ..config import MemberEndpoints
from ..transport.tls import TlsError
from . import offline, render
from .backup import cmd_backup, cmd_live_backup
from .client import use_certs
from .commands import ACTIONS, Options, emit, run
from .offline import OFFLINE
from .restore import cmd_restore

QUERIES = ("describe", "health", "list-members", "recording-log", "errors", "timings", "stalls")
DIRECTORY_COMMANDS = (*OFFLINE, "backup", "restore")
"""Commands on data directories, with no cluster."""
COMMANDS = (
    *QUERIES,
    "is-leader",
    *ACTIONS,
    "invalidate-latest-snapshot",
    "certs",
    *DIRECTORY_COMMANDS,
)

_HELP = {
    "describe": "every member's role, term, positions, sessions, lag, up/down "
    "(exit 1 when a member is down)",
    "health": "exit 0 when every member is up and healthy and one ready leader has a "
    "quorum, ACTIVE, its disk writable; else 1, with each member's reason",
    "list-members": "the members and their endpoints, as the leader sees them",
    "recording-log": "each member's recording log (terms, snapshots), times in UTC",
    "errors": "each member's distinct warnings and errors, with counts and first/last times",
    "timings": "each member's fsync, duty-cycle, commit and replication-lag times",
    "stalls": "each member's event-loop stalls over --stall-threshold, with what ran",
    "snapshot": "take a snapshot on every member; waits until it is taken",
    "suspend": "stop applying client messages until resume",
    "resume": "resume after suspend",
    "shutdown": "snapshot, then every member stops",
    "abort": "every member stops, no snapshot",
    "stop": "stop --member N alone, as SIGTERM does (a leader hands leadership over first)",
    "transfer-leadership": "the leader hands leadership to --to N (default: its most "
    "up-to-date follower) and waits until it leads",
    "invalidate-latest-snapshot": "mark the latest snapshot invalid in the recording log "
    "(of --member N, or of every member)",
    "certs": "make the cluster's certificates in --out DIR (no cluster needed)",
    "is-leader": "exit 0 when --member N is the leader, else 1 (for scripts)",
    "pid": "the process holding the data directory --dir (no cluster needed); exit 1 "
    "when none does",
    "verify": "check every record, the recording log and the snapshots of the data "
    "directory --dir (no cluster needed); exit 1 on damage, naming file and offset",
    "recovery-plan": "which snapshot a start of --dir would load and which log it would "
    "replay (no cluster needed)",
    "describe-snapshot": "the latest valid snapshot of --dir: position, term, time, "
    "sessions, timers, service state (no cluster needed)",
    "backup": "copy the live cluster's latest snapshot and committed log from the leader "
    "(or --member N) over the admin port to --out, or a stopped member's directory "
    "--from-dir; every record checked; prints the log position it covers",
    "restore": "make member --member-id's data directory --dir from the backup --from "
    "(a new cluster, or --same-cluster; --to-position P or --to-time ISO8601: to that point)",
}
_MEMBER_HELP = {
    "describe": "only this member",
    "list-members": "the members as this member sees them (default: the leader)",
    "recording-log": "only this member",
    "errors": "only this member",
    "timings": "only this member",
    "stalls": "only this member",
    "invalidate-latest-snapshot": "only this member (default: every member)",
    "is-leader": "the member asked about (required)",
}


def _common(parser: argparse.ArgumentParser, *, top: bool, network: bool = True) -> None:
    """The options every command takes, before or after its name: given after, they win;
    the subcommands' copies default to nothing so that they never undo the first ones."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    add_members(parser, None if top else argparse.SUPPRESS)
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default=default("table"),
        help="table (for people, the default) or json (one document, see docs/cluster-tool.md)",
    )
    parser.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const="json",
        default=argparse.SUPPRESS,
        help="the same as --output json",
    )
    if not network:
        return
    parser.add_argument(
        "--timeout",
        type=duration_seconds,
        default=default(2.0),
        help="per-member reply timeout (default 2s)",
    )
    parser.add_argument(
        "--certs-dir",
        default=default(os.environ.get(CLIENT_CERTS_VARIABLE)),
        help="a client-<NAME> folder from `cluster-tool certs`, for a cluster with TLS; "
        f"control commands need an admin principal (default: ${CLIENT_CERTS_VARIABLE})",
    )


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-tool",
        allow_abbrev=False,  # `--member 1` is not `--members 1`
        description="Query and control a Triarch cluster through its members' admin ports.",
        epilog="`cluster-tool COMMAND --help` shows a command's options.  Cluster actions "
        "(snapshot, suspend, resume, shutdown, abort, transfer-leadership) go to the leader, "
        "or to --member; "
        "members accept them only from their own host (or, with TLS, an admin principal).  "
        "Exit codes: 0 ok, 1 refused, failed or a member down, 2 usage.",
    )
    add_version(parser)
    _common(parser, top=True)
    # before the command, as before it had subcommands (hidden; checked in main)
    parser.add_argument("--member", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot-timeout", type=duration_seconds, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=UsageParser
    )
    for name in COMMANDS:
        sub = commands.add_parser(
            name, help=_HELP[name], description=_HELP[name], allow_abbrev=False
        )
        add_version(sub)
        _common(sub, top=False,
                network=name not in ("certs", *DIRECTORY_COMMANDS) or name == "backup")  # fmt: skip
        if name in _MEMBER_HELP or name in ACTIONS:
            sub.add_argument(
                "--member",
                type=int,
                default=argparse.SUPPRESS,
                metavar="N",
                help=_MEMBER_HELP.get(name, "send it to this member (default: the leader)"),
            )
        if name == "snapshot":
            sub.add_argument(
                "--snapshot-timeout",
                type=duration_seconds,
                default=argparse.SUPPRESS,
                help="how long to wait for the snapshot to be taken (default 30s)",
            )
        if name == "transfer-leadership":
            sub.add_argument(
                "--to",
                type=int,
                default=None,
                metavar="N",
                help="the member to hand leadership to (default: the leader picks the most "
                "up-to-date voting follower)",
            )
        if name == "errors":
            sub.add_argument(
                "--limit",
                type=_positive,
                default=None,
                metavar="N",
                help="only the N distinct errors seen most recently, per member",
            )
        if name == "certs":
            _certs_options(sub)
        if name in OFFLINE:
            sub.add_argument(
                "--dir", type=Path, required=True, help="a member's data directory (or a copy)"
            )
        if name == "backup":
            sub.add_argument("--from-dir", type=Path, default=None,
                             help="a stopped member's data directory (offline; without "
                             "it, the live cluster over --members' admin ports)")  # fmt: skip
            sub.add_argument("--member", type=int, default=argparse.SUPPRESS, metavar="N",
                             help="back up from this member (default: the leader)")  # fmt: skip
            sub.add_argument("--out", type=Path, required=True, help="a new directory")
        if name == "restore":
            _restore_options(sub)
    return parser


def _restore_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from", type=Path, required=True, help="the backup directory")
    sub.add_argument("--dir", type=Path, required=True, help="the member's new data directory")
    sub.add_argument("--member-id", type=int, required=True, help="the member it is for")
    sub.add_argument(
        "--same-cluster",
        action="store_true",
        help="replace a lost member of the backup's own cluster (needs --cluster-commit)",
    )
    sub.add_argument(
        "--cluster-commit",
        type=int,
        default=None,
        metavar="P",
        help="with --same-cluster: the commit position the cluster reached; refused if the "
        "backup covers less",
    )
    sub.add_argument(
        "--to-position",
        type=int,
        default=None,
        metavar="P",
        help="restore to this log position (a record's end, from the backup's oldest snapshot on)",
    )
    sub.add_argument(
        "--to-time",
        type=_instant,
        default=None,
        metavar="ISO8601",
        help="restore to the last record at or before this time, with its zone "
        "(2026-11-28T14:05:00Z, or +01:00); `verify --dir BACKUP` shows the times it holds",
    )


def _instant(text: str) -> int:
    """An ISO-8601 time with its zone, as cluster time (epoch milliseconds, rounded down:
    the log's times are whole milliseconds)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time: {text!r} (for example 2026-11-28T14:05:00Z)"
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone: add Z (UTC) or an offset such as +01:00"
        )
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _certs_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--out", type=Path, required=True, help="the directory of the certificates")
    sub.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="NAME",
        help="a client principal besides admin and app (repeatable)",
    )
    sub.add_argument(
        "--days",
        type=int,
        default=DEFAULT_DAYS,
        help=f"how long the certificates are valid (default {DEFAULT_DAYS} days)",
    )


def cmd_certs(parser: UsageParser, members: Sequence[MemberEndpoints], args: Any) -> int:
    """``certs``: make the cluster's certificates; one line per folder made or kept."""
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
    if args.output == "json":
        emit(render.certs_document(str(args.out), folders, created))
        return 0
    for folder in folders:
        print(f"{'created' if folder in created else 'kept':<8}{folder}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "restore":
        if args.members:
            ids = {m.member_id for m in parser.members(args.members)}
            if args.member_id not in ids:
                parser.error(f"--member-id {args.member_id} is not in --members")
        if args.cluster_commit is not None and not args.same_cluster:
            parser.error("--cluster-commit goes with --same-cluster (a new cluster, the "
                         "default, has no commit position to reach): add --same-cluster, "
                         "or leave --cluster-commit out")  # fmt: skip
        if args.to_position is not None and args.to_time is not None:
            parser.error("give --to-position or --to-time, not both")
    if args.command in OFFLINE:
        return offline.run(args.command, args)
    if args.command == "backup":
        if args.from_dir is None:
            return cmd_live_backup(parser, args)
        if args.member is not None:
            parser.error("backup --from-dir takes no --member")
        return cmd_backup(args)
    if args.command == "restore":
        return cmd_restore(args)
    members = parser.members(args.members)
    if args.command == "certs":
        return cmd_certs(parser, members, args)
    member = args.member
    if member is not None and args.command not in (*_MEMBER_HELP, *ACTIONS):
        parser.error(f"{args.command} takes no --member")
    if args.snapshot_timeout is not None and args.command != "snapshot":
        parser.error(f"{args.command} takes no --snapshot-timeout")
    if args.command in ("stop", "is-leader") and member is None:
        parser.error(f"{args.command} needs --member N")
    if member is not None and member not in {m.member_id for m in members}:
        parser.error(f"--member {member} is not in --members")
    to = getattr(args, "to", None)
    if to is not None and to not in {m.member_id for m in members}:
        parser.error(f"--to {to} is not in --members")
    try:
        use_certs(args.certs_dir)
    except TlsError as exc:
        parser.error(f"--certs-dir: {exc}")
    opts = Options(
        members,
        output=args.output,
        timeout=args.timeout,
        snapshot_timeout=args.snapshot_timeout or 30.0,
        member=member,
        limit=getattr(args, "limit", None),
        to=to,
    )
    try:
        return trio.run(run, opts, args.command)
    except KeyboardInterrupt:
        return 130

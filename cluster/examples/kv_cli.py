"""``cluster-kv``: the KV example's command-line client, in the manner of ``etcdctl``
(also ``python -m cluster.examples.kv``).  ``docs/cluster-kv.md`` is its page.

::

    cluster-kv --members 0=127.0.0.1:9010:9020:9030 put greeting hello
    cluster-kv get greeting                    # with CLUSTER_MEMBERS set
    cluster-kv cas greeting hello hi           # exit 1 when the value was not hello
    cluster-kv cas --absent lock me            # set only if absent
    cluster-kv del greeting                    # exit 1 when it was absent
    cluster-kv --json watch config/            # one JSON object per change, until Ctrl-C

``--members`` takes the members as ``cluster-tool`` does
(``0=host:ingress:consensus:admin,...``) or the ingress endpoints alone
(``0=host:port,...``).  Each command opens a session (one round trip to find the leader),
does its one thing and closes it.  Keys and values are UTF-8 text on the command line (a
value's bytes are the argument's bytes as the shell gave them); printed, a value that is
not UTF-8 has backslash escapes (``\\xff``), and with ``--json`` it is given as
``value_base64`` instead of ``value``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import trio

import client
from client import (
    AuthenticationRejectedError,
    CertsDirError,
    ConnectTimeoutError,
    QueryRefusedError,
    ServiceError,
    SessionClosedError,
    SessionRejectedError,
)

from ..cli import CLIENT_CERTS_VARIABLE, UsageParser, add_members, add_version, duration_seconds
from ..members import check_members, parse_members
from .kv import CompareAndSet, KeyValueClient, KeyValueError, WatchError

__all__ = [
    "EXIT_FALSE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

EXIT_OK = 0
EXIT_FALSE = 1
"""The key is absent (get, del), or a compare-and-set found another value."""
EXIT_USAGE = 2
"""Bad arguments: the command line, ``--members``, ``--certs-dir``."""
EXIT_UNREACHABLE = 3
"""No session with the cluster within ``--timeout``, no answer within it, or the
session was lost."""
EXIT_REFUSED = 4
"""The cluster or the service refused: the session (authentication), the request (the
service raised, a query refused), or a watch that failed."""

_COMMANDS = {
    "get": "print the value of KEY (a linearizable query: no log entry); exit 1 when absent",
    "put": "store VALUE under KEY",
    "del": "delete KEY; exit 1 when it was absent",
    "cas": "set KEY to NEW if it holds OLD (with --absent: if it is absent, and no OLD); "
    "exit 1 when it did not",
    "watch": "print every change under PREFIX from now on, one line each, until Ctrl-C",
}


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name (after wins)."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    add_members(parser, None if top else argparse.SUPPRESS)
    parser.add_argument(
        "--certs-dir",
        default=default(os.environ.get(CLIENT_CERTS_VARIABLE)),
        help="a client-<NAME> folder from `cluster-tool certs`, for a cluster with TLS "
        f"(default: ${CLIENT_CERTS_VARIABLE})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print one JSON object per line",
    )
    parser.add_argument(
        "--timeout",
        type=duration_seconds,
        default=default(5.0),
        help="how long to wait for a session and for each answer (default 5s)",
    )


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-kv",
        allow_abbrev=False,
        description="Read and write the KV example service (cluster.examples.kv) of a "
        "Triarch cluster.",
        epilog="Exit codes: 0 ok; 1 the key is absent (get, del) or cas did not set it; "
        "2 usage; 3 the cluster could not be reached or did not answer within --timeout; "
        "4 the cluster or the service refused.  Values are UTF-8 text; printed, bytes "
        "that are not UTF-8 have backslash escapes (with --json: value_base64).",
    )
    add_version(parser)
    _common(parser, top=True)
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=UsageParser
    )
    for name, text in _COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text, allow_abbrev=False)
        _common(sub, top=False)
        if name == "watch":
            sub.add_argument("prefix", metavar="PREFIX", help='a key prefix ("" for every key)')
            continue
        sub.add_argument("key", metavar="KEY")
        if name == "get":
            sub.add_argument(
                "--consistency",
                choices=("linearizable", "follower"),
                default="linearizable",
                help="linearizable (the default: the leader, ReadIndex) or follower "
                "(never older than what this client has seen): see docs/queries.md",
            )
        elif name == "put":
            sub.add_argument("value", metavar="VALUE")
            sub.add_argument(
                "--ttl",
                type=duration_seconds,
                default=None,
                help="the key expires after this long (e.g. 30s), on every member",
            )
        elif name == "cas":
            sub.add_argument("values", nargs="+", metavar="OLD NEW", help="OLD NEW, or NEW")
            sub.add_argument(
                "--absent",
                action="store_true",
                help="set KEY only if it is absent (then give NEW alone)",
            )
    return parser


def _ingress_endpoints(parser: UsageParser, text: str) -> str:
    """The ingress endpoints of ``--members``: the members' list, as ``cluster-tool``
    takes it, or ingress endpoints already; a usage error naming what is wrong."""
    from client._endpoints import parse_endpoints

    if not text:
        parser.error("--members is required (or set CLUSTER_MEMBERS)")
    try:
        members = check_members(parse_members(text), ports=False)
        return ",".join(
            f"{m.member_id}={f'[{m.host}]' if ':' in m.host else m.host}:{m.ingress_port}"
            for m in members
        )
    except ValueError as exc:
        members_error = exc
    try:
        parse_endpoints(text)
    except ValueError as exc:
        first = text.split(",")[0].partition("=")[2]
        error = members_error if first.count(":") >= 3 else exc
        parser.error(
            f"--members: {error} (give 0=host:ingress:consensus:admin,... or the ingress "
            "endpoints 0=host:port,...)"
        )
    return text


def _key(parser: UsageParser, text: str, what: str = "KEY") -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        parser.error(f"{what} {text!r} is not UTF-8 text")
    return text


def _value_fields(value: bytes | None) -> dict[str, Any]:
    if value is None:
        return {"value": None}
    try:
        return {"value": value.decode("utf-8")}
    except UnicodeDecodeError:
        return {"value_base64": base64.b64encode(value).decode("ascii")}


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def _one_line_text(value: bytes) -> str:
    """A value on one line of ``watch``: its line breaks as ``\\n`` and ``\\r``."""
    return _text(value).replace("\n", "\\n").replace("\r", "\\r")


class _Output:
    """Where a command's result goes: a line of text, or a JSON object, on stdout;
    the reason for exit 1 on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def show(self, text: str, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False) if self.as_json else text
        print(line, flush=True)

    @staticmethod
    def why(message: str) -> None:
        print(f"cluster-kv: {message}", file=sys.stderr, flush=True)


async def _get(kv: KeyValueClient, args: argparse.Namespace, out: _Output) -> int:
    value = await kv.get(args.key, consistency=args.consistency)
    if value is None:
        if out.as_json:
            out.show("", {"key": args.key, "value": None})
        out.why(f"{args.key!r} is absent")
        return EXIT_FALSE
    out.show(_text(value), {"key": args.key, **_value_fields(value)})
    return EXIT_OK


async def _put(kv: KeyValueClient, args: argparse.Namespace, out: _Output) -> int:
    await kv.put(args.key, os.fsencode(args.value), ttl=args.ttl)
    out.show("OK", {"key": args.key, "ok": True})
    return EXIT_OK


async def _del(kv: KeyValueClient, args: argparse.Namespace, out: _Output) -> int:
    deleted = await kv.delete(args.key)
    if not deleted:
        if out.as_json:
            out.show("", {"key": args.key, "deleted": False})
        out.why(f"{args.key!r} is absent")
        return EXIT_FALSE
    out.show("OK", {"key": args.key, "deleted": True})
    return EXIT_OK


async def _cas(kv: KeyValueClient, args: argparse.Namespace, out: _Output) -> int:
    *old, new = args.values
    expected = None if args.absent else os.fsencode(old[0])
    response = await kv.request(CompareAndSet, args.key, expected, os.fsencode(new))
    if response.ok:
        out.show("OK", {"key": args.key, "ok": True})
        return EXIT_OK
    current = response.value
    if out.as_json:
        out.show("", {"key": args.key, "ok": False, **_value_fields(current)})
    holds = "is absent" if current is None else f"holds {_text(current)!r}"
    out.why(f"cas did not set {args.key!r}: it {holds}")
    return EXIT_FALSE


async def _watch(kv: KeyValueClient, args: argparse.Namespace, out: _Output) -> int:
    async with kv.watch(args.prefix) as changes:
        out.why(f"watching {args.prefix!r} (Ctrl-C to stop)")
        async for change in changes:
            text = (
                f"DEL {change.key}"
                if change.value is None
                else f"PUT {change.key} {_one_line_text(change.value)}"
            )
            out.show(
                text,
                {
                    "key": change.key,
                    **_value_fields(change.value),
                    "position": change.position,
                    "timestamp": change.timestamp,
                },
            )
    return EXIT_OK


_RUN: dict[str, Callable[[KeyValueClient, argparse.Namespace, _Output], Any]] = {
    "get": _get,
    "put": _put,
    "del": _del,
    "cas": _cas,
    "watch": _watch,
}


async def _session(args: argparse.Namespace, endpoints: str) -> int:
    out = _Output(args.json)
    async with (
        client.connect(endpoints, connect_timeout=args.timeout, certs_dir=args.certs_dir) as c,
        KeyValueClient(c, timeout=args.timeout) as kv,  # a watch: its registration
    ):
        code: int = await _RUN[args.command](kv, args, out)
        return code


async def _run(args: argparse.Namespace, endpoints: str) -> int:
    """The command; a watch runs until SIGINT or SIGTERM, then closes its session
    (which ends the watch on the members too) and exits 0."""
    if args.command != "watch":
        return await _session(args, endpoints)
    from client._exception_groups import raise_unwrapped

    async def stop_on_signal(scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                scope.cancel()
                return

    code = EXIT_OK
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signal, nursery.cancel_scope)
            code = await _session(args, endpoints)
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise_unwrapped(group, None)
    return code


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _failure(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and message of an error a command can meet (None: a bug)."""
    if isinstance(exc, CertsDirError):
        return EXIT_USAGE, "--certs-dir: " + _one_line(exc).removeprefix("certs_dir: ")
    if isinstance(exc, ConnectTimeoutError):
        return EXIT_UNREACHABLE, f"cannot reach the cluster: {_one_line(exc)}"
    if isinstance(exc, SessionRejectedError | AuthenticationRejectedError):
        return EXIT_REFUSED, _one_line(exc)
    if isinstance(exc, SessionClosedError):
        return EXIT_UNREACHABLE, _one_line(exc)
    if isinstance(exc, TimeoutError):
        return EXIT_UNREACHABLE, _one_line(exc)
    if isinstance(exc, ServiceError | QueryRefusedError | KeyValueError | WatchError):
        return EXIT_REFUSED, _one_line(exc)
    return None


def _quiet_stdout() -> None:
    """stdout's reader went away (``| head``): nothing more can be printed there, and
    Python's own flush at exit must not complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    endpoints = _ingress_endpoints(parser, args.members)
    if args.command == "watch":
        _key(parser, args.prefix, "PREFIX")
    else:
        _key(parser, args.key)
    if args.command == "cas" and len(args.values) != (1 if args.absent else 2):
        parser.error("cas takes KEY NEW with --absent" if args.absent else "cas takes KEY OLD NEW")
    if args.certs_dir == "":
        args.certs_dir = None
    try:
        return trio.run(_run, args, endpoints)
    except KeyboardInterrupt:
        return EXIT_OK if args.command == "watch" else 130
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except Exception as exc:
        failure = _failure(exc)
        if failure is None:
            raise
        code, message = failure
        _Output.why(message)
        return code


if __name__ == "__main__":
    sys.exit(main())

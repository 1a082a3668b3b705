"""``cluster-backup`` (also ``python -m cluster.backup``): the continuous backup.

    cluster-backup --members MEMBERS --out DIR [--certs-dir DIR] [--metrics-port P]
                   [--interval S] [--retention N] [--max-lag BYTES] [--max-poll-age S]

Follows the cluster (:mod:`cluster.backup.follow`) and keeps, in ``DIR``, the latest
``--retention`` snapshots and the committed log after the oldest of them, in the format
``cluster-tool restore --from DIR`` reads at any time (:mod:`cluster.backup.store`).
Started again on the same ``DIR`` it goes on where it stopped.  SIGTERM or SIGINT stops
it after the write under way (the manifest names only what is whole).  Exit codes: 0
stopped by a signal, 1 the backup's manifest is unreadable, its disk fails or the
metrics port cannot be listened on, 2 usage: among them a ``DIR`` that is not its own
(a one-shot backup it must not extend, other files), and members that require TLS
when no ``--certs-dir`` was given.  Nothing is written to ``DIR`` before the first log.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import trio

from ..archive.segments import DEFAULT_SEGMENT_SIZE
from ..cli import (
    CLIENT_CERTS_VARIABLE,
    UsageParser,
    add_members,
    add_version,
    duration_seconds,
)
from ..tool.client import use_certs
from ..transport.tls import TlsError
from ..units import parse_size
from .follow import Follower, NeedsCertificates
from .http import BackupHttp
from .link import client_identity
from .store import BackupStore, NotContinuous, StoreError

log = logging.getLogger("cluster.backup")


def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if value <= 0:
        raise ValueError(f"must be positive: {text!r}")
    return value


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="cluster-backup",
        description="Follow a Triarch cluster and keep its latest snapshots and committed "
        "log in --out, restorable at any time with `cluster-tool restore --from DIR`.",
    )
    add_version(parser)
    add_members(parser)
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the backup directory (new, or one this program wrote: it goes on)",
    )
    parser.add_argument(
        "--certs-dir",
        default=os.environ.get(CLIENT_CERTS_VARIABLE),
        help="a client-<NAME> folder of an admin principal, for a cluster "
        f"with TLS (default: ${CLIENT_CERTS_VARIABLE}, as for cluster-tool)",
    )
    parser.add_argument(
        "--interval",
        type=duration_seconds,
        default=1.0,
        help="how often to poll the cluster (default 1s)",
    )
    parser.add_argument(
        "--retention",
        type=int,
        default=2,
        help="snapshots kept, with the log from the oldest (default 2)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics and /health on this port (0: any free port)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="the address /metrics is served on (default 127.0.0.1)",
    )
    parser.add_argument(
        "--max-lag",
        type=_size,
        default=64 << 20,
        help="/health is 503 beyond this lag in bytes (default 64MiB)",
    )
    parser.add_argument(
        "--max-poll-age",
        type=duration_seconds,
        default=None,
        help="/health is 503 when the last good poll is older "
        "(default: 10 intervals, at least 10s)",
    )
    parser.add_argument(
        "--segment-size",
        type=_size,
        default=DEFAULT_SEGMENT_SIZE,
        help="bytes per log segment of the backup (default 64MiB)",
    )
    parser.add_argument(
        "--timeout",
        type=duration_seconds,
        default=10.0,
        help="a member's reply timeout (default 10s)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    return parser  # fmt: skip


async def run(follower: Follower, http: BackupHttp | None) -> None:
    async with trio.open_nursery() as nursery:
        if http is not None:
            port = await nursery.start(http.run)
            print(f"cluster-backup: /metrics and /health on {http.host}:{port}", flush=True)

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(on_signal)
        await follower.run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    members = parser.members(args.members)
    if args.retention < 1:
        parser.error("--retention must be at least 1")
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        tls = client_identity(args.certs_dir, "cluster-backup")
        use_certs(args.certs_dir)
    except TlsError as exc:
        parser.error(f"--certs-dir: {exc}")
    try:
        store = BackupStore.open(args.out, args.segment_size)
    except NotContinuous as exc:
        parser.error(f"--out: {exc}")
    except (StoreError, OSError) as exc:
        print(f"cluster-backup: error: {exc}", file=sys.stderr)
        return 1
    if store.log_end is not None:
        log.info("going on with the backup in %s: log [%d, %d)", args.out, store.log_start,
                 store.log_end)  # fmt: skip
    follower = Follower(members, store, tls=tls, keep=args.retention, interval=args.interval,
                        limit=args.timeout)  # fmt: skip
    max_age = args.max_poll_age or max(10.0, 10 * args.interval)
    http = None
    if args.metrics_port is not None:
        http = BackupHttp(
            args.metrics_host, args.metrics_port, follower.state, args.max_lag, max_age
        )
    failures: list[str] = []
    usage: list[str] = []
    try:
        try:
            trio.run(run, follower, http)
        except* OSError as group:  # the metrics port in use, the backup's disk
            failures += [str(exc) for exc in _leaves(group)]
        except* NeedsCertificates as group:
            held = "nothing was written to" if store.log_end is None else "left as it was:"
            usage += [f"{exc}; {held} {args.out}" for exc in _leaves(group)]
    except KeyboardInterrupt:
        pass
    for failure in [*usage, *failures]:
        print(f"cluster-backup: error: {failure}", file=sys.stderr)
    return 2 if usage else 1 if failures else 0


_E = TypeVar("_E", bound=BaseException)


def _leaves(group: BaseExceptionGroup[_E]) -> list[_E]:
    found: list[_E] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found += _leaves(exc)
        else:
            found.append(exc)
    return found

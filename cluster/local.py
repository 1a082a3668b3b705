"""Run a local cluster: ``python -m cluster.local --nodes 3 --service MODULE:CLASS --dir DIR``.

Starts that many ``python -m cluster.node`` processes on free loopback ports, prints the
members and ingress endpoints, and stops them (SIGTERM, then SIGKILL) on Ctrl-C or
SIGTERM (exit code 0).

It supervises them as a process supervisor does.  A member that exits is named with its
exit code on stderr; then the others are stopped and it exits with 1 (or 0 when every
member stopped by itself with 0 within :data:`SHUTDOWN_GRACE` seconds: ``cluster-tool
shutdown``).  With ``--restart`` a member that failed (a non-zero exit, a signal) is
started again instead, after a pause that doubles while it keeps failing within
:data:`STABLE` seconds of its start (0.5 s to 10 s); one that exits with 0 (stopped on
purpose) or 2 (a setting, a port in use, its data directory: starting it again would not
help) is not.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from .config import add_version

PORTS_VARIABLE = "TRIARCH_LOCAL_PORTS"
"""``LOW-HIGH``: the ports :func:`free_ports` hands out (the test suite gives each of its
workers a slice of its own, so that two workers never pick the same port)."""

_cursors: dict[range, int] = {}
"""Where this process's walk over each range is."""


def _ephemeral_start() -> int:
    """Where the kernel's range for outgoing connections and port-0 binds starts."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere ports are picked by the OS (below)


def port_range() -> range:
    """The ports :func:`free_ports` picks from: ``$TRIARCH_LOCAL_PORTS``, or the 12,000
    below the ephemeral range; empty where there is no room below it."""
    spec = os.environ.get(PORTS_VARIABLE)
    if spec:
        low, _, high = spec.partition("-")
        return range(int(low), int(high) + 1)
    top = _ephemeral_start()
    return range(max(10_000, top - 12_000), top)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct ports that are free right now, none handed out by this process in the
    last lap of its walk over the range.

    They come from below the kernel's ephemeral range (:func:`port_range`): a port
    picked there is not taken by an outgoing connection's source port, or by another
    program's port-0 probe, between this call and the node's bind, nor while a member
    is down between a kill and its restart on the same port (a port the OS picked would
    be).  Each process walks the range from a place of its own (its pid).
    """
    ports = port_range()
    if len(ports) < 4 * count:  # no room below the ephemeral range: let the OS pick
        with ExitStack() as stack:
            socks = [stack.enter_context(socket.socket()) for _ in range(count)]
            for s in socks:
                s.bind((host, 0))
            return [s.getsockname()[1] for s in socks]
    cursor = _cursors.get(ports, os.getpid() * 7919 % len(ports))
    chosen: list[int] = []
    for _ in range(len(ports)):
        port = ports[cursor]
        cursor = _cursors[ports] = (cursor + 1) % len(ports)
        if _bindable(host, port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise OSError(f"fewer than {count} free ports in {ports.start}-{ports.stop - 1}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def members_string(nodes: int, host: str = "127.0.0.1") -> str:
    ports = free_ports(3 * nodes, host)
    return ",".join(
        f"{i}={host}:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(nodes)
    )


def ingress_endpoints(members: str) -> str:
    parts = []
    for member in members.split(","):
        ident, _, rest = member.partition("=")
        host, ingress, _consensus, _admin = rest.rsplit(":", 3)
        parts.append(f"{ident}={host}:{ingress}")
    return ",".join(parts)


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class LocalCluster:
    """Node processes for demos, benchmarks and tests."""

    def __init__(
        self,
        nodes: int,
        service: str,
        directory: str | os.PathLike[str],
        *,
        extra_args: Sequence[str] = (),
        members: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        certs: str | os.PathLike[str] | None = None,
    ) -> None:
        """``certs``: a directory made by ``cluster-tool certs``; each member then runs
        with ``--certs-dir certs/member-<id>``."""
        self.certs = Path(certs) if certs is not None else None
        self.nodes = nodes
        self.service = service
        self.directory = Path(directory)
        self.extra_args = list(extra_args)
        self.members = members or members_string(nodes)
        self.log_dir = Path(log_dir) if log_dir else self.directory
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def ingress_endpoints(self) -> str:
        return ingress_endpoints(self.members)

    def command(self, member_id: int) -> list[str]:
        certs = (
            [] if self.certs is None else ["--certs-dir", str(self.certs / f"member-{member_id}")]
        )
        return [
            sys.executable,
            "-m",
            "cluster.node",
            "--member-id",
            str(member_id),
            "--members",
            self.members,
            "--dir",
            str(self.directory / f"node-{member_id}"),
            "--service",
            self.service,
            *certs,
            *self.extra_args,
        ]

    def start(self, member_id: int) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"node-{member_id}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(self.command(member_id), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.processes[member_id] = proc
        return proc

    def start_all(self, timeout: float = 15.0) -> None:
        for member_id in range(self.nodes):
            self.start(member_id)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 15.0, member_ids: Sequence[int] | None = None) -> None:
        for part in self.ingress_endpoints.split(","):
            ident, _, hostport = part.partition("=")
            if member_ids is not None and int(ident) not in member_ids:
                continue
            host, _, port = hostport.rpartition(":")
            proc = self.processes.get(int(ident))
            if not wait_for_port(host, int(port), timeout):
                code = proc.poll() if proc else None
                raise RuntimeError(
                    f"member {ident} not listening on {hostport} after {timeout}s "
                    f"(exit code {code}); see {self.log_dir / f'node-{ident}.log'}"
                )

    def pid(self, member_id: int) -> int:
        return self.processes[member_id].pid

    def signal(self, member_id: int, signum: int) -> None:
        self.processes[member_id].send_signal(signum)

    def stop(self, member_id: int, timeout: float = 10.0) -> int | None:
        proc = self.processes.pop(member_id, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self, member_id: int) -> None:
        proc = self.processes.pop(member_id, None)
        if proc is not None:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for member_id in list(self.processes):
            self.stop(member_id)

    def __enter__(self) -> LocalCluster:
        self.start_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


SHUTDOWN_GRACE = 2.0
"""Seconds to wait, once a member exited with 0, for the others to stop by themselves."""
STABLE = 10.0
"""A member that ran this long before it failed is restarted after the shortest pause."""
FIRST_PAUSE, LONGEST_PAUSE = 0.5, 10.0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def describe_exit(code: int) -> str:
    """``code 1``, or ``code -9 (SIGKILL)`` for a process a signal ended."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Supervisor:
    """Watches a started :class:`LocalCluster`'s members (see the module's docstring)."""

    def __init__(self, cluster: LocalCluster, restart: bool = False, poll: float = 0.2) -> None:
        self.cluster = cluster
        self.restart = restart
        self.poll = poll
        self.started = {m: time.monotonic() for m in cluster.processes}
        self.pauses = {m: FIRST_PAUSE for m in cluster.processes}
        self.due: dict[int, float] = {}  # members to start again, and when
        self.restarts = 0

    def _log(self, member_id: int) -> Path:
        return self.cluster.log_dir / f"node-{member_id}.log"

    def _exited(self) -> dict[int, int]:
        return {
            m: code
            for m, p in self.cluster.processes.items()
            if m not in self.due and (code := p.poll()) is not None
        }

    def run(self) -> int:
        """Until a member exits (without ``restart``); the exit code."""
        while True:
            for member_id, at in list(self.due.items()):
                if time.monotonic() >= at:
                    del self.due[member_id]
                    self.cluster.start(member_id)
                    self.started[member_id] = time.monotonic()
                    self.restarts += 1
                    _say(f"member {member_id} started again (pid {self.cluster.pid(member_id)})")
            for member_id, code in sorted(self._exited().items()):
                if self.restart and code not in (0, 2):
                    self._schedule(member_id, code)
                    continue
                return self._stop(member_id, code)
            time.sleep(self.poll)

    def _schedule(self, member_id: int, code: int) -> None:
        ran = time.monotonic() - self.started[member_id]
        pause = FIRST_PAUSE if ran >= STABLE else self.pauses[member_id]
        self.pauses[member_id] = min(pause * 2, LONGEST_PAUSE)
        self.due[member_id] = time.monotonic() + pause
        _say(
            f"member {member_id} exited with {describe_exit(code)} after {ran:.1f} s "
            f"(see {self._log(member_id)}); restarting it in {pause:g} s"
        )

    def _stop(self, member_id: int, code: int) -> int:
        why = {0: "it stopped on purpose", 2: "a setting, a port or its data directory"}
        note = f" ({why[code]}: not restarted)" if self.restart and code in why else ""
        _say(
            f"member {member_id} exited with {describe_exit(code)}{note}; "
            f"see {self._log(member_id)}"
        )
        if code == 0:  # a cluster-wide shutdown stops every member with 0
            deadline = time.monotonic() + SHUTDOWN_GRACE
            while time.monotonic() < deadline and any(
                p.poll() is None for p in self.cluster.processes.values()
            ):
                time.sleep(0.05)
            codes = [p.poll() for p in self.cluster.processes.values()]
            if all(c == 0 for c in codes) and not self.due:
                _say("every member stopped with exit code 0")
                return 0
        running = [m for m, p in self.cluster.processes.items() if p.poll() is None]
        if running:
            _say(f"stopping the other members: {', '.join(map(str, running))}")
        return 1


def build_parser() -> argparse.ArgumentParser:
    """``cluster-local``'s own options; whatever else it is given goes to every node."""
    parser = argparse.ArgumentParser(
        prog="python -m cluster.local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(parser)
    parser.add_argument("--nodes", type=int, default=1, help="number of members (default 1)")
    parser.add_argument("--service", default="cluster.examples.kv:KeyValueService")
    parser.add_argument("--dir", default="cluster-local", help="data directory")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start a member that failed again (else: stop the others and exit 1)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # stop the members as on Ctrl-C
    cluster = LocalCluster(args.nodes, args.service, args.dir, extra_args=extra)
    try:  # from here on a signal stops whatever members have started
        try:
            cluster.start_all()
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"members: {cluster.members}")
        print(f"ingress endpoints: {cluster.ingress_endpoints}")
        print(f"logs: {cluster.log_dir}/node-*.log  (Ctrl-C to stop)", flush=True)
        return Supervisor(cluster, restart=args.restart).run()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one: the members still stop
        cluster.stop_all()


if __name__ == "__main__":
    sys.exit(main())

"""Run a local cluster: ``python -m cluster.local --nodes 3 --service MODULE:CLASS --dir DIR``.

Starts that many ``python -m cluster.node`` processes on free loopback ports, prints the
members and ingress endpoints, and stops them (SIGTERM, then SIGKILL) on Ctrl-C.
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


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the OS says are free right now (all bound at once, so distinct)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.local", description=__doc__)
    add_version(parser)
    parser.add_argument("--nodes", type=int, default=1, help="number of members (default 1)")
    parser.add_argument("--service", default="cluster.examples.kv:KeyValueService")
    parser.add_argument("--dir", default="cluster-local", help="data directory")
    args, extra = parser.parse_known_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # stop the members as on Ctrl-C
    cluster = LocalCluster(args.nodes, args.service, args.dir, extra_args=extra)
    reported: set[int] = set()
    try:  # from here on a signal stops whatever members have started
        try:
            cluster.start_all()
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"members: {cluster.members}")
        print(f"ingress endpoints: {cluster.ingress_endpoints}")
        print(f"logs: {cluster.log_dir}/node-*.log  (Ctrl-C to stop)", flush=True)
        while any(p.poll() is None for p in cluster.processes.values()):
            for member_id, proc in cluster.processes.items():
                if proc.poll() is not None and member_id not in reported:
                    reported.add(member_id)
                    print(
                        f"member {member_id} exited with code {proc.returncode}; "
                        "the others keep running",
                        file=sys.stderr,
                        flush=True,
                    )
            time.sleep(0.5)
        print("every member has exited", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one: the members still stop
        cluster.stop_all()


if __name__ == "__main__":
    sys.exit(main())

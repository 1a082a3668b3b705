#!/usr/bin/env python3
"""The machine's floor for one message in flight through three replicas.

Triarch's path for one message is client → leader → two followers (each appends and
fsyncs) → leader (commits on its own sync and the first follower's acknowledgement) →
client.  This script sends one message at a time along the same four hops, between
the same four processes, over loopback TCP, with the same syncs, and nothing else: no
framing, no encoding, no consensus, no service.  What it measures is what the machine
(its wake-ups, its disk) and the framework cost before any consensus logic, so a
latency target can be judged against it:

- ``--nodes plain``: the three node processes block in ``recv``/``epoll`` (the least
  Python can do);
- ``--nodes trio``: each node runs Trio, as ``cluster.node`` does (one task per
  connection, ``SocketStream``), which is what the design asks of a node;
- ``--nodes both`` (the default) runs one after the other.

The client is a plain blocking process in both (it is the same in both, and a Trio
client measured the same).  ``--fsync none`` leaves the syncs out.

    python3 scripts/dev.py floor            # both, 5,000 round trips each
    python3 scripts/floor_bench.py --json --count 2000 --nodes trio
    python3 scripts/floor_bench.py --rate 1000 --count 10000   # paced, as scripts/probe.py
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.metrics import Histogram, cpu_seconds  # noqa: E402

PAYLOAD = b"x" * 64  # about the size of a framed 32-byte echo message
WARMUP = 500  # round trips before measuring


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _log_fd(directory: str, name: str) -> int:
    return os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _append(fd: int, data: bytes, sync: bool) -> None:
    os.write(fd, data)
    if sync:
        os.fdatasync(fd)


# -- plain blocking nodes ----------------------------------------------------------------


def _plain_follower(leader_port: int, directory: str, sync: bool) -> None:
    sock = _nodelay(socket.create_connection(("127.0.0.1", leader_port)))
    fd = _log_fd(directory, f"follower-{os.getpid()}")
    while data := sock.recv(65536):
        _append(fd, data, sync)
        sock.sendall(b"k" * len(data))  # one byte of acknowledgement per byte appended


def _plain_leader(client_port: int, followers: socket.socket, directory: str, sync: bool) -> None:
    links = [_nodelay(followers.accept()[0]) for _ in range(2)]
    client = _nodelay(socket.create_connection(("127.0.0.1", client_port)))
    fd = _log_fd(directory, "leader")
    poller = select.epoll()
    by_fd = {link.fileno(): link for link in links}
    for link in links:
        poller.register(link.fileno(), select.EPOLLIN)
    acked = dict.fromkeys(by_fd, 0)  # bytes each follower has appended
    sent = 0  # bytes replicated
    while message := client.recv(65536):
        for link in links:
            link.sendall(message)
        sent += len(message)
        _append(fd, message, sync)
        # committed once one follower has it too (the leader's own copy is the other)
        while max(acked.values()) < sent:
            for ready, _ in poller.poll():
                acked[ready] += len(by_fd[ready].recv(65536))
        client.sendall(message)


# -- Trio nodes --------------------------------------------------------------------------


def _trio_follower(leader_port: int, directory: str, sync: bool) -> None:
    import trio

    async def main() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", leader_port)
        fd = _log_fd(directory, f"follower-{os.getpid()}")
        while data := await stream.receive_some(65536):
            _append(fd, data, sync)
            await stream.send_all(b"k" * len(data))

    trio.run(main)


def _trio_leader(client_port: int, followers: socket.socket, directory: str, sync: bool) -> None:
    import trio

    async def main() -> None:
        links = [
            trio.SocketStream(trio.socket.from_stdlib_socket(_nodelay(followers.accept()[0])))
            for _ in range(2)
        ]
        client = trio.SocketStream(
            trio.socket.from_stdlib_socket(
                _nodelay(socket.create_connection(("127.0.0.1", client_port)))
            )
        )
        fd = _log_fd(directory, "leader")
        acks = [0, 0]  # bytes each follower has appended
        acked = trio.Event()

        async def read_acks(i: int, link: trio.SocketStream) -> None:
            while data := await link.receive_some(65536):
                acks[i] += len(data)
                acked.set()

        async with trio.open_nursery() as nursery:
            for i, link in enumerate(links):
                nursery.start_soon(read_acks, i, link)
            sent = 0
            while message := await client.receive_some(65536):
                for link in links:
                    await link.send_all(message)
                sent += len(message)
                _append(fd, message, sync)
                while max(acks) < sent:
                    acked = trio.Event()
                    await acked.wait()
                await client.send_all(message)
            nursery.cancel_scope.cancel()

    trio.run(main)


NODES: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {
    "plain": (_plain_leader, _plain_follower),
    "trio": (_trio_leader, _trio_follower),
}


def _paced(sock: socket.socket, count: int, rate: float, hist: Histogram) -> None:
    """Send ``WARMUP + count`` messages at ``rate`` per second from a thread, each timed
    from its real send to its reply (in order: the floor's leader answers in order)."""
    sends: collections.deque[int] = collections.deque()
    total = WARMUP + count
    failed: list[BaseException] = []

    def sender() -> None:
        start = time.perf_counter()
        try:
            for k in range(total):
                delay = start + k / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sends.append(time.perf_counter_ns())
                sock.sendall(PAYLOAD)
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    pending = 0
    for i in range(total):
        while pending < len(PAYLOAD):
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"the leader closed the connection ({failed})")
            pending += len(data)
        pending -= len(PAYLOAD)
        sent = sends.popleft()
        if i >= WARMUP:
            hist.record(time.perf_counter_ns() - sent)
    thread.join()


def run_floor(nodes: str, count: int, sync: bool, rate: float | None = None) -> dict[str, Any]:
    """``count`` round trips of one message through a leader and two followers run as
    ``nodes`` (``plain`` or ``trio``); latency percentiles and CPU per round trip.  With
    ``rate``, messages are sent at that pace instead of one after the other (paced: the
    machine's own stalls show in the tail as they do in ``scripts/probe.py``'s)."""
    leader_fn, follower_fn = NODES[nodes]
    ctx = multiprocessing.get_context("fork")
    with (
        tempfile.TemporaryDirectory(prefix="triarch-floor-") as directory,
        socket.create_server(("127.0.0.1", 0)) as client_listener,
        socket.create_server(("127.0.0.1", 0)) as follower_listener,
    ):
        follower_port = follower_listener.getsockname()[1]
        processes = [
            ctx.Process(target=follower_fn, args=(follower_port, directory, sync), daemon=True)
            for _ in range(2)
        ]
        processes.append(
            ctx.Process(
                target=leader_fn,
                args=(client_listener.getsockname()[1], follower_listener, directory, sync),
                daemon=True,
            )
        )
        for process in processes:
            process.start()
        client_listener.settimeout(30)
        sock = _nodelay(client_listener.accept()[0])
        sock.settimeout(30)
        try:
            hist = Histogram()
            names = ["follower 1", "follower 2", "leader", "client"]
            pids = [p.pid or 0 for p in processes] + [os.getpid()]
            before: list[float] = []
            started = 0.0
            if rate:
                before = [cpu_seconds(pid) or 0.0 for pid in pids]
                started = time.perf_counter() + WARMUP / rate
                _paced(sock, count, rate, hist)
            for i in range(WARMUP + count if not rate else 0):
                if i == WARMUP:
                    before = [cpu_seconds(pid) or 0.0 for pid in pids]
                    started = time.perf_counter()
                t0 = time.perf_counter_ns()
                sock.sendall(PAYLOAD)
                got = 0
                while got < len(PAYLOAD):
                    data = sock.recv(65536)
                    if not data:
                        raise RuntimeError(f"the {nodes} leader closed the connection")
                    got += len(data)
                if i >= WARMUP:
                    hist.record(time.perf_counter_ns() - t0)
            elapsed = time.perf_counter() - started
            cpu = {
                name: round(((cpu_seconds(pid) or 0.0) - b) / count * 1e6, 1)
                for name, pid, b in zip(names, pids, before, strict=True)
            }
        finally:
            sock.close()
            for process in processes:
                process.terminate()
                process.join(5)
    return {
        "nodes": nodes,
        "fsync": "batch" if sync else "none",
        "rate": rate,
        "round_trips": count,
        "round_trips_per_s": round(count / elapsed, 1),
        "latency_us": {
            "p50": hist.percentile(50) / 1e3,
            "p90": hist.percentile(90) / 1e3,
            "p99": hist.percentile(99) / 1e3,
            "p999": hist.percentile(99.9) / 1e3,
            "max": hist.max / 1e3,
        },
        "distribution_us": [(q, v / 1e3) for q, v in hist.distribution()],
        "cpu_us_per_round_trip": cpu,
    }


def describe(result: dict[str, Any]) -> str:
    lat = result["latency_us"]
    cpu = ", ".join(f"{k} {v:.0f}" for k, v in result["cpu_us_per_round_trip"].items())
    load = f"paced at {result['rate']:,.0f}/s" if result.get("rate") else "one in flight"
    return (
        f"[floor, {result['nodes']} nodes, fsync={result['fsync']}] {load}: "
        f"p50 {lat['p50']:.0f} us  p90 {lat['p90']:.0f} us  p99 {lat['p99']:.0f} us  "
        f"p999 {lat['p999']:.0f} us  max {lat['max']:.0f} us "
        f"({result['round_trips']} round trips)\n"
        f"  CPU per round trip (us): {cpu}"
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", choices=["plain", "trio", "both"], default="both")
    p.add_argument("--count", type=int, default=5000, help="measured round trips")
    p.add_argument("--fsync", choices=["batch", "none"], default="batch")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="paced: send this many messages/s (--count of them) instead of one at a time",
    )
    p.add_argument("--json", action="store_true", help="print JSON only")
    args = p.parse_args()
    if args.count < 1:
        p.error("--count must be at least 1")
    if args.rate is not None and not args.rate > 0:
        p.error("--rate must be a positive number of messages per second")
    kinds = ["plain", "trio"] if args.nodes == "both" else [args.nodes]
    try:
        results = [run_floor(kind, args.count, args.fsync == "batch", args.rate) for kind in kinds]
    except (OSError, RuntimeError) as exc:  # a node process failed: no reply, or none in 30 s
        print(f"error: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0]))
    else:
        for result in results:
            print(describe(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

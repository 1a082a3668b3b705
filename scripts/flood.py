#!/usr/bin/env python3
"""Overload probe: one flooding client beside a well-behaved one.

Starts a local cluster running the echo service (or uses ``--endpoints``), measures a
well-behaved client's echo rate alone (``--window`` messages in flight, ``--payload``
bytes each), then again while a flooder sends ``--flood-payload`` byte messages as fast
as the cluster takes them and never reads a reply (a raw socket: it opens a session and
then only writes).  Prints both rates, the ratio, the longest gap between two of the
good client's replies, and the leader's RSS before, during and after, as text or
``--json``.

    python3 scripts/flood.py --nodes 1 --duration 10
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import client  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402
from cluster.protocol.codec import EGRESS  # noqa: E402
from cluster.protocol.egress import SessionEvent  # noqa: E402
from cluster.protocol.enums import EventCode  # noqa: E402
from cluster.protocol.framing import FrameDecoder, encode_frame  # noqa: E402
from cluster.protocol.ingress import SessionConnectRequest, SessionMessageHeader  # noqa: E402
from cluster.protocol.version import PROTOCOL_VERSION  # noqa: E402


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_raw_session(host: str, port: int, timeout: float = 10.0) -> tuple[socket.socket, int, int]:
    """A session on a plain socket: ``(socket, session id, leadership term)``; follows
    redirects to the leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.sendall(encode_frame(SessionConnectRequest(1, 0, PROTOCOL_VERSION, "")))
        decoder = FrameDecoder(1 << 20)
        event: SessionEvent | None = None
        while event is None:
            data = sock.recv(65536)
            if not data:
                break
            for body in decoder.feed(data):
                message = EGRESS.decode(body)
                if isinstance(message, SessionEvent):
                    event = message
                    break
        if event is not None and event.code == EventCode.OK:
            return sock, event.cluster_session_id, event.leadership_term_id
        sock.close()
        if event is not None and event.code == EventCode.REDIRECT:
            leader = event.leader_member_id
            for entry in event.detail.split(","):
                member, _, address = entry.partition("=")
                if leader >= 0 and member == str(leader):
                    host, _, port_text = address.rpartition(":")
                    port = int(port_text)
        elif event is not None:
            raise SystemExit(f"flooder: session refused: {event}")
        time.sleep(0.2)
    raise SystemExit("flooder: no session")


def flood(host: str, port: int, payload: int) -> None:
    """The flooder's own process: blocking sends of ``payload`` byte messages until
    SIGTERM; prints how many it sent."""
    sock, session_id, term = open_raw_session(host, port)
    body = encode_frame(SessionMessageHeader(term, session_id, 0, b"x" * payload))
    batch = body * max(1, 65536 // len(body))
    per_batch = len(batch) // len(body)
    sent = 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("flooding", flush=True)
    try:
        while True:
            try:
                sock.sendall(batch)
            except OSError:
                break  # closed by the node
            sent += per_batch
    finally:
        print(sent, flush=True)
        sock.close()


async def good_client(
    endpoints: str, window: int, payload: int, duration: float, result: dict[str, Any]
) -> None:
    message = b"g" * payload
    async with client.connect(endpoints) as c:
        for _ in range(window):
            await c.offer(message)
        received = 0
        last = time.perf_counter()
        max_gap = 0.0
        start = last
        end = start + duration
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            with trio.move_on_after(end - now):
                replies = await c.receive_many()
                now = time.perf_counter()
                max_gap = max(max_gap, now - last)
                last = now
                received += len(replies)
                await c.offer_many([message] * len(replies))
        elapsed = time.perf_counter() - start
        max_gap = max(max_gap, time.perf_counter() - last)
        result["rate"] = received / elapsed
        result["max_gap_ms"] = max_gap * 1000


async def measure(
    args: argparse.Namespace, endpoints: str, leader_pid: int | None
) -> dict[str, Any]:
    host, _, port = endpoints.split(",")[0].partition("=")[2].rpartition(":")
    out: dict[str, Any] = {}
    alone: dict[str, Any] = {}
    out["rss_before_kib"] = rss_kib(leader_pid) if leader_pid else 0
    await good_client(endpoints, args.window, args.payload, args.duration, alone)
    out["alone_msg_s"] = round(alone["rate"])
    out["alone_max_gap_ms"] = round(alone["max_gap_ms"], 1)
    stop = trio.Event()
    flooded: dict[str, Any] = {}
    peak = [0]

    async def sample() -> None:
        while not stop.is_set():
            if leader_pid:
                peak[0] = max(peak[0], rss_kib(leader_pid))
            await trio.sleep(0.2)

    flooder = subprocess.Popen(  # noqa: ASYNC220 (a script: starting it may block)
        [
            sys.executable,
            __file__,
            "--flood",
            f"{host}:{port}",
            "--flood-payload",
            str(args.flood_payload),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flooder.stdout is not None
    flooder.stdout.readline()  # its session is open
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        await trio.sleep(1.0)  # let the flood build up
        await good_client(endpoints, args.window, args.payload, args.duration, flooded)
        stop.set()
    flooder.terminate()
    sent = [int(flooder.stdout.read().strip() or 0)]
    flooder.wait()
    out["flooded_msg_s"] = round(flooded["rate"])
    out["flooded_max_gap_ms"] = round(flooded["max_gap_ms"], 1)
    out["ratio"] = round(flooded["rate"] / alone["rate"], 3) if alone["rate"] else 0.0
    out["flood_messages_sent"] = sent[0]
    out["rss_peak_kib"] = peak[0]
    await trio.sleep(1.0)
    out["rss_after_kib"] = rss_kib(leader_pid) if leader_pid else 0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--window", type=int, default=32, help="good client's messages in flight")
    parser.add_argument("--payload", type=int, default=32)
    parser.add_argument("--flood-payload", type=int, default=2048)
    parser.add_argument("--endpoints", default=None, help="a running cluster's ingress")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--flood", metavar="HOST:PORT", help=argparse.SUPPRESS)
    parser.add_argument("node_args", nargs="*", help="extra node settings (after --)")
    args = parser.parse_args(argv)
    if args.flood:
        host, _, port = args.flood.rpartition(":")
        flood(host, int(port), args.flood_payload)
        return 0
    if args.endpoints:
        result = trio.run(measure, args, args.endpoints, None)
    else:
        with (
            tempfile.TemporaryDirectory() as tmp,
            LocalCluster(
                args.nodes,
                "cluster.examples.echo:EchoService",
                tmp,
                extra_args=list(args.node_args),
            ) as cluster,
        ):
            time.sleep(1.0)  # an election
            pid = cluster.processes[0].pid if args.nodes == 1 else None
            result = trio.run(measure, args, cluster.ingress_endpoints, pid)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

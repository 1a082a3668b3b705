"""Reads against writes, side by side (``scripts/bench.py --reads``; issue 43).

One local cluster of ``--nodes`` members running the KV example; the same sessions
(``--clients``, each keeping its share of ``--in-flight`` requests outstanding, closed
loop) run three phases in turn on it, each a warm-up and a measured period:

- ``put``: ``KeyValueClient.put``, through the log (appended, replicated to a quorum,
  fdatasynced, applied);
- ``get``: ``KeyValueClient.get``, a linearizable query (ReadIndex: no log, no disk);
- ``follower get``: ``KeyValueClient.get(consistency="follower")``, answered by any
  member, spread over them by the client.

Every request is one awaited call of the KV client, as an application makes it, so the
three phases cost the client alike and differ only in what the cluster does. Prints
requests/s and latency percentiles per phase and the ratios the issue asks of them
(get throughput at least 3x put's, get p50 at most half of put's).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

import client
from cluster.examples.kv import KeyValueClient
from cluster.metrics import Histogram

KEYS = 64
"""Keys the phases read and write (each worker keeps to one)."""

VALUE = b"v" * 32

PHASES = (("put", None), ("get", "linearizable"), ("follower get", "follower"))


class Phase:
    """What one phase measured."""

    def __init__(self) -> None:
        self.histogram = Histogram()
        self.done = 0
        self.measuring = False


async def _worker(kv: KeyValueClient, key: str, consistency: str | None, phase: Phase) -> None:
    """One request outstanding, for ever (the phase cancels it)."""
    record = phase.histogram.record
    clock = time.perf_counter_ns
    while True:
        started = clock()
        if consistency is None:
            await kv.put(key, VALUE)
        else:
            await kv.get(key, consistency=consistency)
        if phase.measuring:
            record(clock() - started)
            phase.done += 1


async def _phase(
    sessions: list[KeyValueClient],
    windows: list[int],
    consistency: str | None,
    warmup: float,
    duration: float,
) -> dict[str, Any]:
    phase = Phase()
    async with trio.open_nursery() as nursery:
        worker = 0
        for kv, window in zip(sessions, windows, strict=True):
            for _ in range(window):
                nursery.start_soon(_worker, kv, f"k{worker % KEYS}", consistency, phase)
                worker += 1
        await trio.sleep(warmup)
        phase.measuring = True
        started = time.perf_counter()
        await trio.sleep(duration)
        elapsed = time.perf_counter() - started
        phase.measuring = False
        nursery.cancel_scope.cancel()
    h = phase.histogram
    return {
        "requests": phase.done,
        "requests_per_s": round(phase.done / elapsed, 1),
        "latency_us": {
            "p50": h.percentile(50) / 1e3,
            "p90": h.percentile(90) / 1e3,
            "p99": h.percentile(99) / 1e3,
            "max": h.max / 1e3,
            "samples": h.count,
        },
    }


async def run(
    endpoints: str,
    windows: list[int],
    warmup: float,
    duration: float,
    certs_dir: Path | None = None,
) -> dict[str, Any]:
    """The three phases on the same sessions: a dict of phase name -> figures, plus
    ``ratios``."""
    results: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        sessions: list[KeyValueClient] = []
        stop = trio.Event()
        ready = trio.Semaphore(0)

        async def session() -> None:
            async with (
                client.connect(endpoints, connect_timeout=10, certs_dir=certs_dir) as c,
                KeyValueClient(c) as kv,
            ):
                sessions.append(kv)
                ready.release()
                await stop.wait()

        with trio.fail_after(60):
            for _ in windows:  # one at a time: a member bounds the sessions connecting
                nursery.start_soon(session)  # from one address at once
                await ready.acquire()
        for i in range(KEYS):  # every key has a value: a get reads something
            await sessions[0].put(f"k{i}", VALUE)
        for name, consistency in PHASES:
            results[name] = await _phase(sessions, windows, consistency, warmup, duration)
        stop.set()
    put, get = results["put"], results["get"]
    follower = results["follower get"]
    results["ratios"] = {
        "get_vs_put_throughput": round(get["requests_per_s"] / max(put["requests_per_s"], 1), 2),
        "get_vs_put_p50": round(get["latency_us"]["p50"] / max(put["latency_us"]["p50"], 1e-9), 2),
        "follower_vs_get_throughput": round(
            follower["requests_per_s"] / max(get["requests_per_s"], 1), 2
        ),
    }
    return results


def print_text(result: dict[str, Any], nodes: int, clients: int, in_flight: int) -> None:
    print(
        f"[triarch reads] {nodes} node(s), KV example, {clients} clients, "
        f"{in_flight} requests in flight (closed loop)"
    )
    for name, _ in PHASES:
        figures = result[name]
        lat = figures["latency_us"]
        print(
            f"  {name:>12}: {figures['requests_per_s']:>9,.0f} req/s   p50 {lat['p50']:>7.0f} us"
            f"   p90 {lat['p90']:>7.0f} us   p99 {lat['p99']:>7.0f} us"
        )
    ratios = result["ratios"]
    print(
        f"  get / put: {ratios['get_vs_put_throughput']}x the throughput (aim >= 3x), "
        f"{ratios['get_vs_put_p50']}x the p50 (aim <= 0.5x); "
        f"follower get / get: {ratios['follower_vs_get_throughput']}x the throughput"
    )

"""The commit-latency histogram measures what its name says (issue 35): a real member in
this process, on real files and sockets, whose disk is made slow by a known delay (every
``fdatasync`` sleeps ``DELAY`` first, then syncs for real), scraped at ``/metrics``.

Each write waits for its sync before it commits, so every commit latency the leader
observes is at least ``DELAY``.  Before the fix the histogram put most observations at
0: a commit made by the drive that wrote the log was stamped with the time the drive
began, and an idle leader re-stamped its last, long committed position at every slow tick
(every 10 ms) and observed it as committed at once.
"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from test_member_links import cluster
from test_node import endpoints, make_config, running_node

import client
from cluster.examples.echo import EchoService
from cluster.examples.kv import KeyValueClient
from cluster.local import free_ports
from cluster.metrics import LATENCY_BOUNDS_S

DELAY = 0.015
MESSAGES = 12


def scrape(port: int) -> dict[str, dict[str, float]]:
    """Each histogram's cumulative buckets by ``le``, with ``_sum`` and ``_count``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        h = out.setdefault(family.name, {})
        for s in family.samples:
            key = s.labels["le"] if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]
            h[key] = s.value
    return out


def below(h: dict[str, float], seconds: float) -> float:
    """Observations in the buckets whose upper bound is under ``seconds``."""
    bounds = [float(le) for le in h if le not in ("+Inf", "sum", "count")]
    under = [b for b in bounds if b < seconds]
    return h[repr(max(under))] if under else 0.0


def slow_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fdatasync in this process takes ``DELAY`` more: a blocking sleep (the sync
    blocks the loop, or the writer thread, as a slow disk does), then the real one."""
    real_sync = os.fdatasync

    def slow_sync(fd: int) -> None:
        time.sleep(DELAY)
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)


@pytest.mark.parametrize("archive_io", ["inline", "thread"])
async def test_commit_latency_is_at_least_a_slow_disks_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive_io: str
) -> None:
    slow_disk(monkeypatch)
    (metrics_port,) = free_ports(1)
    config = make_config(tmp_path, archive_io=archive_io, metrics_port=metrics_port)
    with trio.fail_after(30):
        async with running_node(config, EchoService()) as node:
            async with client.connect(endpoints(node)) as c:
                for i in range(MESSAGES):
                    await c.offer(b"m%d" % i)
                    assert await c.receive() == b"m%d" % i
            await trio.sleep(0.1)  # idle: ten slow ticks, which commit nothing new
            histograms = await trio.to_thread.run_sync(scrape, metrics_port)
    fsync = histograms["triarch_fsync_duration_seconds"]
    commit = histograms["triarch_commit_latency_seconds"]
    assert fsync["count"] >= MESSAGES
    assert below(fsync, DELAY) == 0, fsync  # the delay is there
    assert commit["count"] >= MESSAGES
    assert below(commit, DELAY) == 0, commit  # and every commit waited for it
    assert commit["sum"] >= commit["count"] * DELAY
    assert commit["sum"] / commit["count"] < 1.0  # and little more: nothing stale


async def test_an_idle_leader_with_followers_observes_no_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two members of three in this process (a quorum: the leader's sync and the
    follower's both count): every write's latency is at least one slow sync, and once
    the writes stop, the slow ticks add nothing."""
    slow_disk(monkeypatch)
    with trio.fail_after(30):
        async with cluster(tmp_path) as c:
            async with client.connect(c.ingress) as conn, KeyValueClient(conn) as kv:
                for i in range(MESSAGES):
                    await kv.put(f"k{i}", b"v")
            commit = c.leader.timings.commit
            count = commit.count
            await trio.sleep(0.2)  # twenty slow ticks: followers confirmed, marks forgotten
            assert commit.count == count
    assert count >= MESSAGES
    fast = sum(n for n, b in zip(commit.counts, LATENCY_BOUNDS_S, strict=False) if b < DELAY)
    assert fast == 0, commit.counts
    assert commit.sum_ns >= commit.count * DELAY * 1e9

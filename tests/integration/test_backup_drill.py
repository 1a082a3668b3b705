"""The disaster-recovery drill (issue 34), with real processes.

A 3-member KV cluster runs under a closed-loop writer (unique keys, every
acknowledgement recorded) with ``cluster-backup`` following it, detached (SIGSTOP: it
asks nothing of the cluster) and attached in turns (its ``/metrics`` lag and ``/health``
sampled while attached), and a one-shot ``cluster-tool backup --out`` taken mid-run.
Then every member is killed and its directory destroyed.  A new
cluster is restored from each backup and started: every write acknowledged before the
one-shot backup was asked for (its position covers them) reads back with its value from
the first; every acknowledged write from the second (the continuous backup caught up
before the kill).  A point-in-time restore to a position in the middle of the log holds
exactly the puts before it.  The writer's throughput without and with the backup
attached is printed (``pytest -s``) and kept within a loose bound (a 2-core CI machine
is noisy; the figures go in the report)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import trio
from test_backup_restore import puts_in_log
from test_failover import kv_session, local_cluster, unreadable
from test_tool_offline import tool

from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster, free_ports

pytestmark = pytest.mark.slow

WRITERS = 8
PHASE = 2.5  # seconds of writing without, then with, the backup attached, in turns
ROUNDS = 2
MAX_LAG = 1 << 20
INTERVAL = "500ms"


@dataclass
class Writer:
    kv: KeyValueClient
    acked: dict[str, bytes] = field(default_factory=dict)
    phase: str = "without"
    counts: dict[str, int] = field(default_factory=dict)
    next_key: int = 0

    async def run(self, until: float) -> None:
        async def one() -> None:
            while trio.current_time() < until:
                key = f"d{self.next_key}"
                self.next_key += 1
                value = f"value-of-{key}".encode()
                await self.kv.put(key, value)
                self.acked[key] = value
                self.counts[self.phase] = self.counts.get(self.phase, 0) + 1

        async with trio.open_nursery() as nursery:
            for _ in range(WRITERS):
                nursery.start_soon(one)


def scrape(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def start_backup(
    members: str, out: Path, port: int, log: IO[str], *extra: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.backup", "--members", members, "--out", str(out),
         "--metrics-port", str(port), "--interval", INTERVAL, "--max-lag", str(MAX_LAG),
         "--segment-size", "256KiB", *extra],
        stdout=log, stderr=log,
    )  # fmt: skip


def restore(backup: Path, into: Path, members: int, *extra: str) -> None:
    for member in range(members):
        made = tool(
            "restore", "--from", str(backup), "--dir", str(into / f"node-{member}"),
            "--member-id", str(member), *extra,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr


def test_the_drill(tmp_path: Path) -> None:
    started = time.monotonic()
    port = free_ports(1)[0]
    lags: list[float] = []
    unhealthy: list[str] = []
    figures: dict[str, float] = {}
    oneshot: dict[str, object] = {}
    before_oneshot: dict[str, bytes] = {}
    backup_dir = tmp_path / "continuous"
    backup_log = open(tmp_path / "cluster-backup.log", "w")  # noqa: SIM115
    source = tmp_path / "source"
    procs: list[subprocess.Popen[bytes]] = []

    async def sample(until: trio.Event) -> None:
        while not until.is_set():
            code, text = await trio.to_thread.run_sync(scrape, port, "/metrics")
            if code == 200:
                lags.append(metric(text, "triarch_backup_lag_bytes"))
                lags.append(metric(text, "triarch_backup_lag_before_pull_bytes"))
            code, text = await trio.to_thread.run_sync(scrape, port, "/health")
            if code != 200:
                unhealthy.append(text)
            await trio.sleep(0.5)

    async def healthy() -> None:
        for _ in range(100):  # caught up: the lag known and small, a recent poll
            code, text = await trio.to_thread.run_sync(scrape, port, "/health")
            if code == 200:
                return
            await trio.sleep(0.1)
        raise AssertionError(f"the backup is not healthy: {text}")

    async def drive(cluster: LocalCluster) -> Writer:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            writer = Writer(kv)
            await writer.run(trio.current_time() + 1.0)  # warm-up, not counted
            writer.counts.clear()
            snap = await trio.to_thread.run_sync(tool, "--members", cluster.members, "snapshot")
            assert snap.returncode == 0, snap.stderr
            procs.append(start_backup(cluster.members, backup_dir, port, backup_log))
            await healthy()
            # without and with the backup attached, in turns (a stopped backup asks
            # nothing of the cluster); its lag sampled while it is attached
            elapsed = {"without": 0.0, "with": 0.0}
            stop_sampling = trio.Event()
            async with trio.open_nursery() as nursery:
                for turn in range(ROUNDS):  # without, with, with, without: drift cancels
                    for phase in ("without", "with")[:: 1 if turn % 2 == 0 else -1]:
                        if phase == "without":
                            stop_sampling.set()
                            procs[0].send_signal(signal.SIGSTOP)
                        else:
                            procs[0].send_signal(signal.SIGCONT)
                            await trio.sleep(1.0)  # it catches up with the pause
                            await healthy()
                            stop_sampling = trio.Event()
                            nursery.start_soon(sample, stop_sampling)
                        writer.phase = phase
                        t0 = trio.current_time()
                        await writer.run(t0 + PHASE)
                        elapsed[phase] += trio.current_time() - t0
                    stop_sampling.set()
                for phase, seconds in elapsed.items():
                    figures[phase] = writer.counts[phase] / seconds
                procs[0].send_signal(signal.SIGCONT)
                await trio.sleep(1.0)
                await healthy()

                stop_sampling = trio.Event()
                nursery.start_soon(sample, stop_sampling)
                # mid-run: a snapshot (the continuous backup pulls it), a one-shot backup
                writer.phase = "oneshot"

                async def take_oneshot() -> None:
                    snap = await trio.to_thread.run_sync(
                        tool, "--members", cluster.members, "snapshot"
                    )
                    assert snap.returncode == 0, snap.stderr
                    await trio.sleep(0.5)
                    before_oneshot.update(writer.acked)
                    done = await trio.to_thread.run_sync(
                        tool, "--members", cluster.members, "backup", "--out",
                        str(tmp_path / "oneshot"), "--json",
                    )  # fmt: skip
                    assert done.returncode == 0, done.stderr
                    oneshot.update(json.loads(done.stdout))

                nursery.start_soon(take_oneshot)
                await writer.run(trio.current_time() + 2.5)
                stop_sampling.set()
            # the writer stopped: the continuous backup catches up with the commit
            described = await trio.to_thread.run_sync(
                tool, "--members", cluster.members, "describe", "--json"
            )
            commit = max(m["commit_position"] for m in json.loads(described.stdout)["members"]
                         if m.get("commit_position") is not None)  # fmt: skip
            for _ in range(100):
                _code, text = await trio.to_thread.run_sync(scrape, port, "/metrics")
                if metric(text, "triarch_backup_position") >= commit:
                    break
                await trio.sleep(0.1)
            assert metric(text, "triarch_backup_position") >= commit
            return writer

    try:
        with local_cluster(3, source) as cluster:
            writer = trio.run(drive, cluster)
            for member in range(3):  # the disaster: every member and its disk
                cluster.kill(member)
        shutil.rmtree(source)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(10) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        backup_log.close()
    written = time.monotonic() - started

    # the continuous backup's lag stayed within its bound while the writer ran
    assert lags, "no /metrics sample"
    assert max(lags) <= MAX_LAG
    assert not unhealthy, unhealthy[:3]
    # the writer's throughput with the backup attached: printed; held only loosely, as
    # runs on a shared 2-core machine vary by +-25% with or without it (the backup
    # process itself uses under 1% of a core)
    assert figures["with"] >= 0.5 * figures["without"], figures

    assert oneshot["covers"] > 0
    assert tool("verify", "--dir", str(tmp_path / "oneshot")).returncode == 0
    assert tool("verify", "--dir", str(backup_dir)).returncode == 0

    async def read_back(cluster: LocalCluster, expected: dict[str, bytes]) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            assert await unreadable(kv, expected) == []

    restore(tmp_path / "oneshot", tmp_path / "from-oneshot", 3)
    with local_cluster(3, tmp_path / "from-oneshot") as cluster:
        trio.run(read_back, cluster, before_oneshot)
    restore(backup_dir, tmp_path / "from-continuous", 3)
    with local_cluster(3, tmp_path / "from-continuous") as cluster:
        trio.run(read_back, cluster, writer.acked)

    # point in time: a cut in the middle of the continuous backup's log, from its oldest
    # snapshot (a restore before the latest one starts from the oldest: on a loaded
    # machine the mid-run snapshot can fall at the end of the writes, with no put after)
    manifest = json.loads((backup_dir / "backup.json").read_text())
    oldest = min(s["log_position"] for s in manifest["snapshots"])
    puts = puts_in_log(backup_dir / "archive", oldest, 1 << 62)
    assert len(puts) > 100
    middle = len(puts) // 2
    cut = puts[middle - 1][0]
    restore(backup_dir, tmp_path / "pit", 1, "--to-position", str(cut))
    before = {key for _, key in puts[:middle]}
    after = {key for _, key in puts[middle:]}
    checked = [key for _, key in puts[max(0, middle - 150) : middle + 150]]
    checked += [key for _, key in puts[::25]]

    async def point_in_time(cluster: LocalCluster) -> None:
        async with kv_session(cluster.ingress_endpoints, attempts=3) as (_c, kv):
            for key in checked:
                if key in before:
                    assert await kv.get(key) == writer.acked[key], key
                else:
                    assert key in after
                    assert await kv.get(key) is None, key

    with local_cluster(1, tmp_path / "pit") as cluster:
        trio.run(point_in_time, cluster)

    print(
        f"\n[drill] throughput without the backup {figures['without']:.0f} puts/s, with it "
        f"{figures['with']:.0f} puts/s ({figures['with'] / figures['without']:.1%}); "
        f"backup lag max {max(lags):.0f} bytes over {len(lags)} samples (bound {MAX_LAG}); "
        f"{len(writer.acked)} writes, one-shot covers {oneshot['covers']} "
        f"({len(before_oneshot)} acknowledged before it); continuous holds "
        f"[{manifest['log_start']}, {manifest['covers']}); point in time at {cut} "
        f"({middle} of {len(puts)} puts after the oldest snapshot); writing {written:.1f}s, "
        f"whole drill {time.monotonic() - started:.1f}s",
        flush=True,
    )

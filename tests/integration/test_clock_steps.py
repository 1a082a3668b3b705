"""A leader's wall clock stepped back, then jumped forward, under load (issue 44, item 5).

Every member runs under libfaketime (the PyPI package ``libfaketime``, in the ``dev``
extra: it ships ``libfaketime.so.1``), each with a file of its own naming how far its
wall clock is off (``FAKETIME_TIMESTAMP_FILE``, read again every second:
``FAKETIME_CACHE_DURATION``); its monotonic clock, and so every timeout, is left alone
(``DONT_FAKE_MONOTONIC``).  The test steps the leader's clock 90 s back, then to 60 s
ahead of the real time, while a client writes keys with TTLs (cluster timers), and
then reads the leader's log offline:

* the log's timestamps never decrease;
* while the clock was behind, cluster time stood still (many entries share one
  timestamp) instead of going back;
* after the jump, cluster time is the leader's clock (about 60 s ahead of the real
  time), and the TTLs due by then (30 s) fired at once, each at or after its deadline
  and once, while the hour-long ones did not.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
import trio

import client
from cluster.archive.reader import read_log
from cluster.examples.kv import KeyValueClient, Put, Request
from cluster.local import LocalCluster
from cluster.protocol import LOG
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.log import TimerEvent

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"
SHORT_TTL = 30.0
LONG_TTL = 3600.0
WRITERS = 4
"""Writes in flight at once."""
PHASE = 30
"""Writes acknowledged before the step back, between it and the jump, and after."""
WAIT = 15.0
"""Seconds any condition is waited for (a busy 2-core machine)."""


def faketime_library() -> Path:
    """libfaketime's preload library, or a skip that says why there is none."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or spec.origin is None:
        pytest.skip("libfaketime is not installed (pip install -e '.[dev]' installs it)")
    library = Path(spec.origin).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    if not library.exists():
        pytest.skip(f"the libfaketime package has no preload library at {library}")
    return library


def faked_env(library: Path, offset_file: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LD_PRELOAD": str(library),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_CACHE_DURATION": "1",  # read again each second (every call: 66 µs each)
        "DONT_FAKE_MONOTONIC": "1",
    }


def check_faketime_works(library: Path, tmp_path: Path) -> None:
    """A child with the library preloaded sees its wall clock an hour ahead and its
    monotonic clock as it is; else skip, naming what it saw."""
    offset = tmp_path / "probe-offset"
    offset.write_text("+3600s\n")
    probe = "import time; print(time.time(), time.monotonic())"
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env=faked_env(library, offset),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"a process preloaded with {library} did not run: {exc}")
    wall, mono = float(out[0]), float(out[1])
    if not 3590 < wall - time.time() < 3610 or abs(mono - time.monotonic()) > 30:
        pytest.skip(f"libfaketime did not shift the wall clock alone (saw {out})")


class FakedClocks(LocalCluster):
    """Members whose wall clocks the test moves: member i's offset is in its file."""

    def __init__(self, library: Path, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.library = library

    def offset_file(self, member_id: int) -> Path:
        return self.directory / f"clock-{member_id}"

    def set_offset(self, member_id: int, offset: str) -> None:
        path = self.offset_file(member_id)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(f"{offset}\n")
        os.replace(temporary, path)  # never a half-written file for the reader

    def start(self, member_id: int) -> subprocess.Popen[bytes]:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.offset_file(member_id).exists():
            self.set_offset(member_id, "+0")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"node-{member_id}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            self.command(member_id),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=faked_env(self.library, self.offset_file(member_id)),
        )
        log.close()
        self.processes[member_id] = proc
        return proc


async def wait_until(what: str, predicate: object) -> None:
    """Poll ``predicate`` (a log file, a counter, a query: nothing signals them)."""
    t0 = time.monotonic()
    with trio.move_on_after(WAIT):
        while not await predicate():  # type: ignore[operator]  # noqa: ASYNC110
            await trio.sleep(0.05)
        print(f"[{what}: {time.monotonic() - t0:.2f}s]")
        return
    raise AssertionError(f"not within {WAIT} s: {what}")


async def steps_under_load(cluster: FakedClocks) -> tuple[int, int]:
    """Step the leader's clock back, then forward, while a client writes; returns the
    leader and the real time (epoch ms) of the forward jump."""
    async with client.connect(cluster.ingress_endpoints, connect_timeout=10) as c:
        async with KeyValueClient(c) as kv:
            await kv.put("warm-up", b"1")
            leader = c.leader_member_id
            leader_log = cluster.log_dir / f"node-{leader}.log"
            started = 0
            acknowledged: list[int] = []

            async def load() -> None:
                nonlocal started
                while True:
                    i = started
                    started += 1
                    await kv.put(f"k{i}", b"v", ttl=SHORT_TTL if i % 2 == 0 else LONG_TTL)
                    acknowledged.append(i)

            async def wrote(more: int) -> None:
                target = len(acknowledged) + more
                await wait_until(f"{more} more writes", lambda: _true(len(acknowledged) >= target))

            async def logged(text: str) -> None:
                await wait_until(
                    f"{leader_log} says {text!r}", lambda: _true(text in leader_log.read_text())
                )

            async with trio.open_nursery() as nursery:
                for _ in range(WRITERS):
                    nursery.start_soon(load)
                await wrote(PHASE)
                cluster.set_offset(leader, "-90s")
                await logged("wall clock stepped back")
                await wrote(PHASE)
                # the last short TTL acknowledged before the jump
                last_short = max(i for i in acknowledged if i % 2 == 0)
                jumped_at = int(time.time() * 1000)
                cluster.set_offset(leader, "+60s")
                await logged("wall clock jumped forward")
                await wrote(PHASE)
                nursery.cancel_scope.cancel()
            # timeouts run on the monotonic clock: the steps moved no leadership
            assert c.leader_member_id == leader
            # the short TTLs put before the jump have expired: due at the new time
            for key in ("k0", f"k{last_short}"):
                await wait_until(f"{key} expired", lambda key=key: _absent(kv, key))
            assert await kv.get("k1") == b"v"  # an hour-long one has not
    return leader, jumped_at


async def _true(value: bool) -> bool:
    return value


async def _absent(kv: KeyValueClient, key: str) -> bool:
    return await kv.get(key) is None


def test_a_leader_clock_stepped_back_and_forward_never_moves_cluster_time_back(
    tmp_path: Path,
) -> None:
    library = faketime_library()
    check_faketime_works(library, tmp_path)
    cluster = FakedClocks(library, 3, KV, tmp_path / "cluster")
    t0 = time.monotonic()
    try:
        cluster.start_all(timeout=60.0)  # a busy machine: three interpreters starting
        print(f"[started: {time.monotonic() - t0:.2f}s]")
        leader, jumped_at = trio.run(steps_under_load, cluster)
        print(f"[ran: {time.monotonic() - t0:.2f}s]")
    finally:
        cluster.stop_all()
    print(f"[stopped: {time.monotonic() - t0:.2f}s]")
    archive = cluster.directory / f"node-{leader}" / "archive"
    log = [(position, LOG.decode(body)) for position, body in read_log(archive)]
    stamps = [message.timestamp for _, message in log]
    went_back = [
        (log[i][0], stamps[i - 1], stamps[i])
        for i in range(1, len(log))
        if stamps[i] < stamps[i - 1]
    ]
    assert not went_back, f"cluster time went back at (position, before, after): {went_back[:5]}"
    # while the clock was 90 s behind, cluster time stood at the last timestamp
    _, held = Counter(stamps).most_common(1)[0]
    assert held >= 20, f"no entries share a timestamp: cluster time did not hold ({held})"
    # after the jump, cluster time is the leader's clock, 60 s ahead of the real one
    assert stamps[-1] >= jumped_at + 50_000, (stamps[-1], jumped_at)
    # timers: each TTL's timer fired at or after its deadline, once; the due ones all
    decode = msgspec.msgpack.Decoder(Request).decode
    deadlines: dict[int, tuple[int, int]] = {}  # correlation id -> (deadline, ttl ms)
    fired: dict[int, int] = {}
    for position, message in log:
        if type(message) is SessionMessageHeader and message.cluster_session_id > 0:
            request = decode(message.payload)
            if isinstance(request, Put) and request.ttl_ms:
                cid = len(deadlines) + 1  # the KV service numbers its timers so
                deadlines[cid] = (message.timestamp + request.ttl_ms, request.ttl_ms)
        elif type(message) is TimerEvent:
            assert message.correlation_id not in fired, f"timer fired twice at {position}"
            fired[message.correlation_id] = message.timestamp
    assert fired, "no TTL expired"
    for cid, at in fired.items():
        deadline, ttl = deadlines[cid]
        assert ttl == SHORT_TTL * 1000, f"timer {cid} (a {ttl} ms TTL) fired"
        assert at >= deadline, f"timer {cid} fired at {at}, before its deadline {deadline}"
    due = [c for c, (d, _) in deadlines.items() if d <= stamps[-1] - 1_000]
    assert len(due) >= PHASE  # half the writes of two phases
    assert set(due) <= set(fired), f"due timers not fired: {sorted(set(due) - set(fired))[:5]}"

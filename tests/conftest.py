"""The order the suite runs in, and how ``scripts/dev.py test`` shares the two cores.

The full suite runs on three pytest-xdist workers (``-n 3 --dist loadgroup``), in units
of work that each go to one worker, in this order (``--no-loadscope-reorder`` is set
here, so the order below is the order they are handed out):

1. the heavy tests that keep no time of their own (Spark's jobs, each in a JVM, and the
   wheel built and installed into a fresh virtualenv): one unit, to the first worker;
2. the unit and simulator tests (CPU-bound, in virtual time or none): one unit, to the
   second worker, beside the heavy ones;
3. the real-time tests (real processes, elections, failover, the console watching a
   live cluster), a unit per file: whichever worker is free takes the next, so three
   run at once (on two cores: they mostly wait on timers and sockets), the longest files
   first (:data:`LONGEST_FIRST`); they wait until
   the heavy tests are done (a file lock the heavy worker holds while it runs them), and
   each must hold on a busy 2-core machine;
4. the tests that measure the machine (:data:`ALONE`: the benchmarks' ratios, the stall
   finder's CPU shares, a leader paused just short of the session timeout): one unit,
   last, each test run with the machine to itself (an exclusive lock that the
   real-time tests hold shared).

Run without xdist, the same order holds and nothing waits.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.local import PORTS_VARIABLE, port_range

HEAVY = ("pipeline/", "integration/test_packaging.py")
"""Long, CPU-heavy and timing-insensitive: the first worker's share."""
FIRST = ("unit/", "sim/")
"""Run first on the other worker, beside the heavy tests (the console's tests run live
clusters: they wait)."""
ALONE = (
    "unit/test_stalls.py",
    "integration/test_bench.py::test_open_loop_against_pysyncobj_compares_latency_at_the_same_rate",
    "integration/test_bench.py::test_one_in_flight_is_one_message_in_flight",
    "integration/test_bench.py::test_floor_bench_measures_plain_and_trio_nodes",
    "integration/test_bench.py::test_floor_bench_paced_sends_at_the_rate_asked",
    "integration/test_bench.py::test_the_paced_probe_and_the_bench_open_loop_agree_at_a_low_rate",
    "integration/test_sessions_survive.py::test_a_paused_leader_keeps_every_session",
    "integration/test_overload.py::test_a_flooding_client_does_not_starve_a_well_behaved_one",
)
"""Tests that measure the machine (CPU shares, latency and throughput ratios, rates) or a
margin of time a loaded machine eats (a 9 s pause beside a 10 s session timeout): last,
each alone.  The bench's other tests (its refusals, a report's fields) run with the
real-time ones."""

LONGEST_FIRST = (
    "integration/test_backup_live.py",
    "integration/test_soak.py",
    "integration/test_backup_restore.py",
    "integration/test_kv_cli.py",
    "integration/test_linearizable_history.py",
    "integration/test_backup_drill.py",
    "integration/test_nemesis.py",
    "integration/test_kv_handover.py",
    "integration/test_cluster_tool.py",
    "integration/test_autosnapshot_processes.py",
    "integration/test_exactly_once.py",
    "integration/test_compaction.py",
    "integration/test_handover.py",
    "integration/test_queries.py",
    "integration/test_tool_offline.py",
    "integration/test_kv_history.py",
)
"""The real-time files that take longest (30-80 s each in a CI run), handed out first
and longest first, so that the real-time units end together instead of one long file
running on alone at the end while the other workers wait."""

_TESTS = Path(__file__).parent


def _where(item: pytest.Item) -> str:
    try:
        where = Path(item.path).relative_to(_TESTS).as_posix()
    except ValueError:
        return ""
    name = getattr(item, "originalname", item.name)
    return f"{where}::{name}"


def _kind(where: str) -> int:
    """0 heavy, 1 first, 2 real time, 3 alone: the order of the units."""
    if where.startswith(HEAVY):
        return 0
    if where.startswith(ALONE):
        return 3
    if where.startswith(FIRST):
        return 1
    return 2


def _order(where: str) -> tuple[int, int]:
    """The units' order: by kind, then the longest real-time files first (the sort is
    stable: collection order otherwise)."""
    kind = _kind(where)
    file = where.split("::")[0]
    rank = LONGEST_FIRST.index(file) if kind == 2 and file in LONGEST_FIRST else len(LONGEST_FIRST)
    return kind, rank


def _waits(where: str) -> bool:
    return _kind(where) >= 2


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): run the group on one xdist worker")
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand the units out in order
        config.option.loadscopereorder = False
    if hasattr(config, "workerinput"):
        _ports_of_this_worker(config.workerinput["workerid"])


def _ports_of_this_worker(worker: str) -> None:
    """A slice of the local ports for each worker (and the processes its tests start):
    two workers never pick the same port, so a member restarted on its port finds it
    free (a port another worker picked while it was down took it before, exit code 2)."""
    whole = port_range()
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker.removeprefix("gw"))
    size = len(whole) // count
    if size >= 1000:
        low = whole.start + index * size
        os.environ[PORTS_VARIABLE] = f"{low}-{low + size - 1}"


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups off the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _order(_where(item)))
    for item in items:
        where = _where(item)
        kind = _kind(where)
        group = ("heavy", "first", "", "alone")[kind] or where.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


class _Lock:
    """A file lock the xdist workers of a run share (one file for the checkout)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.held = False

    def hold(self, shared: bool = False) -> None:
        if not self.held:
            fcntl.flock(self._fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            self.held = True

    def release(self) -> None:
        if self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False

    def wait(self) -> None:
        """Until no worker holds the lock (at once in the worker that holds it)."""
        if not self.held:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            fcntl.flock(self._fd, fcntl.LOCK_UN)


_locks: tuple[_Lock, _Lock] | None = None


def _run_locks(config: pytest.Config) -> tuple[_Lock, _Lock] | None:
    """The run's locks in an xdist worker: the heavy tests' (held while they run; the
    real-time tests wait for it) and the machine's (held shared by a real-time test,
    exclusively by one that must be alone); None without xdist (nothing to wait for)."""
    global _locks
    if not hasattr(config, "workerinput"):
        return None
    if _locks is None:  # one file each for the checkout (.pytest_cache is not committed)
        cache = config.rootpath / ".pytest_cache"
        _locks = (_Lock(cache / "heavy-tests.lock"), _Lock(cache / "machine.lock"))
    return _locks


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Hold or wait before the test's protocol starts (outside pytest-timeout's timer:
    a wait is not the test's time)."""
    locks = _run_locks(item.config)
    kind = _kind(_where(item))
    if locks is not None:
        heavy, machine = locks
        if kind == 0:
            heavy.hold()
        elif _waits(_where(item)):
            heavy.wait()
            machine.hold(shared=kind == 2)
    yield
    if locks is not None:
        heavy, machine = locks
        machine.release()
        if nextitem is None or _kind(_where(nextitem)) != 0:
            heavy.release()  # this worker's heavy tests are done (for now)


def pytest_sessionfinish(session: pytest.Session) -> None:
    locks = _run_locks(session.config)
    if locks is not None:
        for lock in locks:
            lock.release()

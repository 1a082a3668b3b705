"""The order the suite runs in, and how ``scripts/dev.py test`` shares the two cores.

The full suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup``): the heavy
tests that keep no time of their own (Spark's jobs, each in a JVM, and the wheel built
and installed into a fresh virtualenv) on one, every other test on the other, one after
the other.  On that worker the unit and simulator tests come first (CPU-bound, in
virtual time or none); the real-time tests (elections, failover, the console watching a
live cluster, the benchmarks' ratios, the stall finder's CPU shares) wait until the
heavy tests are done (a file lock the heavy worker holds while it runs them), so they
have the machine to themselves, as when they were measured.  Run without xdist, the
same order holds and nothing waits.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HEAVY = ("pipeline/", "integration/test_packaging.py")
"""Long, CPU-heavy and timing-insensitive: the other worker's share."""
FIRST = ("unit/", "sim/")
"""Run first on the main worker, beside the heavy tests (the console's tests run live
clusters: they wait)."""
ALONE = ("unit/test_stalls.py",)
"""Tests under ``FIRST`` that measure the loop's CPU share: they wait as the rest do."""

_TESTS = Path(__file__).parent


def _where(item: pytest.Item) -> str:
    try:
        return Path(item.path).relative_to(_TESTS).as_posix()
    except ValueError:
        return ""


def _waits(where: str) -> bool:
    return not where.startswith(FIRST) or where.startswith(ALONE)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): run the group on one xdist worker")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups off the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _waits(_where(item)))  # stable: collection order in each
    for item in items:
        heavy = _where(item).startswith(HEAVY)
        item.add_marker(pytest.mark.xdist_group("heavy" if heavy else "main"))


class _HeavyLock:
    """A file lock the xdist workers of a run share (one file for the checkout): held by
    the worker that runs the heavy tests while it does; the tests that need the machine
    to themselves wait for it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.held = False

    def hold(self) -> None:
        if not self.held:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
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


_lock: _HeavyLock | None = None


def _heavy_lock(config: pytest.Config) -> _HeavyLock | None:
    """The run's lock in an xdist worker; None without xdist (nothing to wait for)."""
    global _lock
    if not hasattr(config, "workerinput"):
        return None
    if _lock is None:  # one file for the checkout (.pytest_cache is not committed)
        _lock = _HeavyLock(config.rootpath / ".pytest_cache" / "heavy-tests.lock")
    return _lock


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Hold or wait before the test's protocol starts (outside pytest-timeout's timer:
    a wait is not the test's time)."""
    lock = _heavy_lock(item.config)
    if lock is not None:
        where = _where(item)
        if where.startswith(HEAVY):
            lock.hold()
        elif _waits(where):
            lock.wait()
    yield
    if lock is not None and (nextitem is None or not _where(nextitem).startswith(HEAVY)):
        lock.release()  # this worker's heavy tests are done (for now)


def pytest_sessionfinish(session: pytest.Session) -> None:
    lock = _heavy_lock(session.config)
    if lock is not None:
        lock.release()

"""A dedicated thread for the archive's blocking writes (Aeron's archive runs its own).

``trio.to_thread.run_sync`` costs 150-180 µs of CPU per call on the development VM
(thread-cache hand-off, thread naming, the entry queue, the wake-up socket); this
thread waits on a queue and answers through a pipe that the event loop already polls,
for about a third of that.  At moderate rates a leader syncs its log about once per
millisecond, so the difference is most of a core's tenth.

Calls run one at a time, in order, and cannot be cancelled half-way (like
``trio.to_thread.run_sync``): a caller whose scope is cancelled still waits for its
call to finish, so the archive is never left with a write in flight that nobody owns.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import trio

_Job = tuple[Callable[..., Any], tuple[Any, ...]] | None


async def run_in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in one of Trio's worker threads."""
    return await trio.to_thread.run_sync(fn, *args)


async def run_inline(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` right here, blocking the event loop (no thread hand-off: a hand-off
    costs about as much as an fdatasync on a fast disk)."""
    return fn(*args)


async def acquire(lock: trio.Lock) -> None:
    """Take ``lock`` (release it with ``lock.release()``) without the scheduling round
    that ``Lock.acquire`` spends when the lock is free: on the write path that round
    costs tens of µs, twice per archive write.  The caller must reach a checkpoint
    soon after (its blocking call does)."""
    if lock.locked():
        await lock.acquire()
    else:
        lock.acquire_nowait()  # a free Trio lock has no waiters: this cannot block


class WorkerThread:
    def __init__(self, name: str = "archive-writer") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._result: tuple[bool, Any] = (True, None)
        self._done_r = self._done_w = -1  # the pipe, made with the thread
        self._lock = trio.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.calls = 0

    def _work(self) -> None:
        jobs = self._jobs
        done = self._done_w
        try:
            while True:
                job = jobs.get()
                if job is None:
                    return
                fn, args = job
                try:
                    self._result = (True, fn(*args))
                except BaseException as exc:  # handed to the caller, which re-raises it
                    self._result = (False, exc)
                os.write(done, b"\0")
        except OSError:
            return  # the reading end was closed: nobody waits any more
        finally:
            os.close(done)  # here, so the fd cannot be reused while this thread writes

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in the thread and return its result (or raise its error)."""
        if self._closed:
            raise RuntimeError(f"{self.name} thread is closed")
        await acquire(self._lock)
        try:
            if self._thread is None:
                self._done_r, self._done_w = os.pipe()
                os.set_blocking(self._done_r, False)
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self.calls += 1
            self._jobs.put((fn, args))
            with trio.CancelScope(shield=True):
                while True:
                    await trio.lowlevel.wait_readable(self._done_r)
                    try:
                        if os.read(self._done_r, 1):
                            break
                    except BlockingIOError:
                        continue
            ok, value = self._result
            self._result = (True, None)
        finally:
            self._lock.release()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the thread after the call under way (if any) and release the pipe; the
        thread closes its own end when it exits."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        self._jobs.put(None)
        try:
            trio.lowlevel.notify_closing(self._done_r)
        except RuntimeError:
            pass  # not in a Trio run: nobody can be waiting on it
        os.close(self._done_r)

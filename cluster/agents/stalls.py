"""The stall finder: every time the node's event loop stops turning for longer than
``--stall-threshold``, a record of how long and what it can tell about why.

A Trio loop turns in passes: it waits for I/O (``epoll``), then runs every task that is
ready, then waits again.  A pass that runs longer than the threshold before waiting
again delays every message that arrived meanwhile, and so does a wait that ends later
than the loop asked (the process was not given a CPU, or the thread waited for the GIL).
So two kinds of stall are recorded:

- ``busy``: a pass ran for ``duration`` before the loop waited again.  With it: the loop
  thread's CPU share of the pass (``cpu_s``, scaled to the whole pass; much less than the
  duration means the thread was not running: the host descheduled it, or another
  thread, the archive writer, held the GIL), the garbage collector's time in it
  (``gc_s``), and where the loop was once the pass had run for the threshold (``where``:
  the innermost frames).  Both ``cpu_s`` and ``where`` come from a sampling thread; for a
  pass it did not see in time, ``cpu_s`` is -1 and ``where`` empty.
- ``late``: a wait for I/O that ended ``duration`` after the time the loop had asked to
  be woken (a timer due: a heartbeat, the slow tick).  Nothing ran in the loop meanwhile:
  the machine (or the GIL) did not let it.

The loop pays one ``perf_counter_ns`` per hook (twice a pass).  The sampling thread looks
every two thresholds while the loop waits, so it sees every pass of twice the threshold
(and some shorter ones): the first time it sees a pass it notes the loop thread's CPU
clock (``pthread_getcpuclockid``; a thread's CPU time is a system call, 1-2 µs on this
VM, too dear for every pass), and it looks again once the pass has run for the
threshold and half a threshold has gone by since that mark, to take the stack if the
pass still runs (so every pass of two and a half thresholds has its stack).  Looking
every threshold cost a node at one message in flight 40-60 µs of CPU a message, and
5-10% of its latency, in GIL handovers.
"""

from __future__ import annotations

import collections
import gc
import sys
import threading
import time
from typing import Any

import trio

from ..metrics import LatencyHistogram
from ..protocol.admin import StallsStatus, StallStatus

RECENT = 32
"""Stalls kept for ``describe``/``cluster-tool stalls`` (the histogram counts them all)."""


class StallWatch(trio.abc.Instrument):
    def __init__(self, threshold_ns: int, epoch_offset_ns: int = 0) -> None:
        self.threshold_ns = threshold_ns
        self.epoch_offset_ns = epoch_offset_ns - time.perf_counter_ns() + time.monotonic_ns()
        self.stalls = LatencyHistogram()
        self.busy = 0
        self.late = 0
        self.recent: collections.deque[StallStatus] = collections.deque(maxlen=RECENT)
        self._pass_start = 0  # perf_counter_ns of the pass under way, 0 while waiting
        self._pass_id = 0
        self._cpu_pass = -1  # the pass the sampler first saw at (_cpu_wall, _cpu_mark)
        self._cpu_wall = 0
        self._cpu_mark = 0
        self._cpu_clock: int | None = None
        self._wait_start = 0
        self._wait_timeout = 0
        self._gc_ns = 0
        self._gc_start = 0
        self._where = ""
        self._where_pass = -1
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self.looks = 0  # how often the sampling thread woke (each a GIL handover)
        self._sampler: threading.Thread | None = None

    # -- the loop's side ----------------------------------------------------------------

    def before_io_wait(self, timeout: float) -> None:
        now = time.perf_counter_ns()
        start = self._pass_start
        if start and now - start > self.threshold_ns:
            self._busy_pass(start, now)
        self._pass_start = 0
        self._wait_start = now
        self._wait_timeout = round(timeout * 1e9)

    def after_io_wait(self, timeout: float) -> None:
        now = time.perf_counter_ns()
        late = now - self._wait_start - self._wait_timeout
        if late > self.threshold_ns:
            self._record("late", now - late, late, 0, "")
        self._pass_id += 1
        self._gc_ns = 0
        self._pass_start = now

    def _busy_pass(self, start: int, now: int) -> None:
        """A pass over the threshold ends: its CPU share as the sampler saw it."""
        cpu = -1
        window = now - self._cpu_wall
        if self._cpu_pass == self._pass_id and window > 0:
            used = time.thread_time_ns() - self._cpu_mark
            cpu = min(now - start, used * (now - start) // window)
        where = self._where if self._where_pass == self._pass_id else ""
        self._record("busy", start, now - start, cpu, where)

    def _record(self, kind: str, start_ns: int, duration_ns: int, cpu_ns: int, where: str) -> None:
        self.stalls.observe_ns(duration_ns)
        if kind == "busy":
            self.busy += 1
        else:
            self.late += 1
        self.recent.append(
            StallStatus(
                at=(start_ns + self.epoch_offset_ns) / 1e9,
                kind=kind,
                duration_s=duration_ns / 1e9,
                cpu_s=cpu_ns / 1e9 if cpu_ns >= 0 else -1.0,
                gc_s=self._gc_ns / 1e9 if kind == "busy" else 0.0,
                where=where,
            )
        )

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        if phase == "start":
            self._gc_start = time.perf_counter_ns()
        elif self._gc_start:
            self._gc_ns += time.perf_counter_ns() - self._gc_start
            self._gc_start = 0

    def status(self) -> StallsStatus:
        return StallsStatus(
            threshold_s=self.threshold_ns / 1e9 if self._sampler is not None else 0.0,
            busy=self.busy,
            late=self.late,
            recent=list(self.recent),
        )

    # -- the sampling thread ------------------------------------------------------------

    def start(self) -> None:
        """Watch the loop of the calling thread (add the instrument, start sampling);
        nothing with a threshold of 0."""
        if self.threshold_ns <= 0 or self._sampler is not None:
            return
        self._loop_thread = threading.get_ident()
        self._cpu_clock = time.pthread_getcpuclockid(self._loop_thread)
        trio.lowlevel.add_instrument(self)
        gc.callbacks.append(self._on_gc)
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, name="stall-sampler", daemon=True)
        self._sampler.start()

    def stop(self) -> None:
        if self._sampler is None:
            return
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        try:
            trio.lowlevel.remove_instrument(self)
        except KeyError:
            pass
        self._sampler.join(1.0)
        self._sampler = None

    def _sample(self) -> None:
        threshold = self.threshold_ns
        idle = 2 * threshold / 1e9  # between looks while no pass is under way
        clock = self._cpu_clock
        stop, sleep, now_ns = self._stop, time.sleep, time.perf_counter_ns
        delay = idle
        # time.sleep, not stop.wait(timeout): half the CPU a wake-up on this VM (32 µs
        # against 61-73), and every wake-up is a GIL handover the loop pays for too.
        while True:
            sleep(delay)
            if stop.is_set():
                return
            self.looks += 1
            delay = idle
            start, pass_id = self._pass_start, self._pass_id
            if not start:
                continue
            now = now_ns()
            if self._cpu_pass != pass_id and clock is not None:
                self._cpu_mark = time.clock_gettime_ns(clock)
                self._cpu_wall, self._cpu_pass = now, pass_id
            if self._where_pass == pass_id:
                continue
            # The stack once the pass has run for the threshold, and not before half a
            # threshold since the CPU mark: the pass's CPU share is measured from that
            # mark to its end, and taking the stack holds the GIL, so a stack taken at
            # the mark would leave a window of little but that.
            due = max(start + threshold, self._cpu_wall + threshold // 2)
            if now < due:
                delay = max(due - now, 500_000) / 1e9  # back then, should it still run
                continue
            place = where(self._loop_thread)
            if place and self._pass_id == pass_id:
                self._where = place
                self._where_pass = pass_id


def where(thread_id: int, depth: int = 4) -> str:
    """The innermost ``depth`` frames of a running thread's stack, innermost first, each as
    ``folder/file:line function``, joined by ``" < "`` (called from); "" if it has none.

    Only code objects' names and line numbers are read, and the frames are let go before
    this returns, with no call in between that could release the GIL (no ``linecache``,
    no I/O): a frame of a running thread kept by another thread keeps its locals alive
    after the function returns, and a ``memoryview`` among them would make the next
    resize of its buffer (the log buffer, a frame decoder's) fail with ``BufferError``."""
    parts: list[str] = []
    # The interpreter may hand the GIL to the running thread between any two bytecodes
    # of this loop; if that thread returns meanwhile, a frame's ``f_back`` can name
    # memory that is gone (CPython 3.11 read an int there: the sampler thread died of
    # an AttributeError in a full run).  So no switch while the stack is walked (a few
    # microseconds), and anything odd ends the walk instead of the sampler.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    frame: Any = None
    try:
        frame = sys._current_frames().get(thread_id)
        while frame is not None and len(parts) < depth:
            code = frame.f_code
            folder_file = "/".join(code.co_filename.rsplit("/", 2)[-2:])
            parts.append(f"{folder_file}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
    except (AttributeError, TypeError):
        pass
    finally:
        del frame
        sys.setswitchinterval(switch)
    return " < ".join(parts)

"""WorkerThread: the archive's dedicated thread for blocking writes."""

from __future__ import annotations

import threading
import time

import pytest
import trio
import trio.lowlevel

from cluster.agents.worker import WorkerThread


async def test_runs_calls_in_its_own_thread_in_order() -> None:
    worker = WorkerThread("test-writer")
    order: list[int] = []
    threads: set[int] = set()

    def job(i: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.001 * (i % 3))
        order.append(i)
        return i * 10

    results: list[int] = []

    async def call(i: int) -> None:
        results.append(await worker.run(job, i))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(call, i)
            await trio.lowlevel.checkpoint()
    assert sorted(results) == [i * 10 for i in range(20)]
    assert sorted(order) == list(range(20))
    assert threads
    assert threading.get_ident() not in threads
    assert len(threads) == 1
    assert worker.calls == 20
    worker.close()
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run(job, 1)


async def test_errors_reach_the_caller_and_the_thread_goes_on() -> None:
    worker = WorkerThread()

    def fail() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        await worker.run(fail)
    assert await worker.run(lambda: "still here") == "still here"
    worker.close()


async def test_a_cancelled_caller_waits_for_its_call_to_finish() -> None:
    worker = WorkerThread()
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.05)
        finished.set()
        return "written"

    with trio.move_on_after(0.005) as scope:
        result = await worker.run(slow)
    assert scope.cancel_called
    # like trio.to_thread.run_sync: the call is not abandoned half-way, and returns
    assert finished.is_set()
    assert result == "written"
    assert await worker.run(lambda: 7) == 7  # and the next call gets its own result
    worker.close()


def test_close_without_use_is_harmless() -> None:
    worker = WorkerThread()
    worker.close()
    worker.close()

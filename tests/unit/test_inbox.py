"""The duty cycle's inbox: client connections' messages taken in fair turns (deficit
round-robin), bounded per connection and in total, and held while the log is full."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.agents.inbox import IngressInbox, SourceQueue
from cluster.core.base import IngressSource


def queue(conn_id: int) -> SourceQueue:
    return SourceQueue(IngressSource(conn_id, "127.0.0.1", None))


def split(batch: list[object]) -> dict[int, list[object]]:
    """The messages of a taken batch by connection (each run follows its source)."""
    out: dict[int, list[object]] = {}
    current = -1
    for item in batch:
        if isinstance(item, IngressSource):
            current = item.conn_id
            out.setdefault(current, [])
        else:
            out[current].append(item)
    return out


def test_a_flood_does_not_crowd_out_a_small_sender() -> None:
    inbox = IngressInbox(quantum=4096, clock=lambda: 0.0)
    flood, small = queue(1), queue(2)
    for n in range(64):  # 64 reads of 16 frames of 1 KiB each
        inbox.add(flood, [("f", n, i) for i in range(16)], 16 * 1024)
    inbox.add(small, ["s1", "s2"], 100)
    taken = split(inbox.take())
    assert taken[2] == ["s1", "s2"]  # the small sender's messages all go in this cycle
    assert len(taken[1]) == 4  # the flood's: one quantum's worth
    assert inbox.wake.is_set()  # more waiting: another cycle
    assert inbox.contended  # two connections took turns: the log queue is kept short
    # the flood's order is kept across turns and chunks
    order = taken[1]
    while inbox.ready:
        order += split(inbox.take()).get(1, [])
    assert order == [("f", n, i) for n in range(64) for i in range(16)]
    assert inbox.queued == 0
    assert flood.bytes == 0


def test_deficit_carries_over_for_a_message_bigger_than_the_quantum() -> None:
    inbox = IngressInbox(quantum=1000, clock=lambda: 0.0)
    big = queue(1)
    inbox.add(big, ["big"], 3500)
    turns = 0
    while True:
        turns += 1
        taken = split(inbox.take())
        if taken:
            assert taken == {1: ["big"]}
            break
    assert turns == 4  # 4 quanta pay for 3,500 bytes
    assert big.deficit == 0
    assert not inbox.ready


def test_the_gate_holds_client_messages_but_not_member_messages() -> None:
    open_ = [False]
    inbox = IngressInbox(gate=lambda: open_[0], clock=lambda: 0.0)
    client = queue(1)
    inbox.add(client, ["c"], 10)
    inbox.messages.append("member")  # type: ignore[arg-type]
    assert inbox.take() == ["member"]
    assert inbox.held_cycles == 1
    inbox.wake = trio.Event()
    inbox.resume()
    assert not inbox.wake.is_set()  # still shut: no cycle for nothing
    open_[0] = True
    inbox.resume()
    assert inbox.wake.is_set()
    assert split(inbox.take()) == {1: ["c"]}


def test_a_closed_connection_is_reported_after_its_last_messages() -> None:
    inbox = IngressInbox(quantum=100, clock=lambda: 0.0)
    q = queue(1)
    inbox.add(q, ["a"], 150)
    closed: list[int] = []
    inbox.close(q, lambda source: closed.append(source.conn_id))
    assert not closed
    assert not inbox.commands
    inbox.take()  # a turn: 100 of 150 bytes, nothing whole yet
    assert not inbox.commands
    assert split(inbox.take()) == {1: ["a"]}
    assert len(inbox.commands) == 1
    inbox.commands.pop()(0)
    assert closed == [1]
    idle = queue(2)
    inbox.close(idle, lambda source: closed.append(source.conn_id))
    assert closed == [1, 2]  # nothing waiting: at once


async def test_readers_wait_for_room_per_connection_and_in_total() -> None:
    inbox = IngressInbox(quantum=1 << 20, max_backlog=1000, max_queued=2500)
    a, b, c = queue(1), queue(2), queue(3)
    inbox.add(a, ["a"], 1000)
    assert inbox.full(a)
    assert not inbox.full(b)
    inbox.add(b, ["b"], 900)
    inbox.add(c, ["c"], 900)
    assert inbox.full(b)  # 2,800 queued in all
    woken: list[int] = []

    async def reader(q: SourceQueue) -> None:
        await inbox.wait_for_room(q)
        woken.append(q.source.conn_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, a)
        nursery.start_soon(reader, b)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        inbox.take()
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(woken) == [1, 2]
    assert inbox.queued == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40), st.integers(1, 9000)), max_size=60),
    st.integers(64, 20_000),
    st.lists(st.booleans(), min_size=1, max_size=20),
)
def test_every_message_is_taken_once_in_its_connections_order(
    reads: list[tuple[int, int, int]], quantum: int, gates: list[bool]
) -> None:
    step = [0]

    def gate() -> bool:
        step[0] += 1
        return gates[step[0] % len(gates)] or step[0] > 10_000

    inbox = IngressInbox(quantum=quantum, gate=gate, clock=lambda: 0.0)
    queues = {conn: queue(conn) for conn in range(6)}
    sent: dict[int, list[tuple[int, int]]] = {conn: [] for conn in range(6)}
    for n, (conn, frames, size) in enumerate(reads):
        messages = [(n, i) for i in range(frames)]
        sent[conn] += messages
        inbox.add(queues[conn], list(messages), size)
    got: dict[int, list[object]] = {conn: [] for conn in range(6)}
    cycles = 0
    while inbox.ready:
        cycles += 1
        assert cycles < 100_000
        for conn, messages in split(inbox.take()).items():
            got[conn] += messages
    assert got == sent
    assert inbox.queued == 0
    assert all(q.bytes == 0 and q.deficit == 0 for q in queues.values())


@pytest.mark.parametrize("quantum", [512, 4096])
def test_a_turn_takes_at_most_a_quantum_plus_one_message_from_each(quantum: int) -> None:
    inbox = IngressInbox(quantum=quantum, clock=lambda: 0.0)
    flood = queue(1)
    for _ in range(10):
        inbox.add(flood, [b"x" * 100 for _ in range(10)], 1000)  # 100 B per message
    while inbox.ready:
        taken = split(inbox.take()).get(1, [])
        assert len(taken) * 100 <= quantum + 100


def test_a_full_window_passes_the_turn_until_its_log_is_applied() -> None:
    now = [0.0]
    applied = [0]
    inbox = IngressInbox(
        quantum=4096, window=4096, clock=lambda: now[0], applied=lambda: applied[0]
    )
    flood, small = queue(1), queue(2)
    for n in range(8):
        inbox.add(flood, [("f", n)], 4096)
    inbox.add(small, ["s1"], 50)
    assert split(inbox.take()) == {1: [("f", 0)], 2: ["s1"]}
    inbox.sequenced(1000)  # both runs are in the log before position 1000
    assert flood.in_flight == 4096
    inbox.add(small, ["s2"], 50)
    assert split(inbox.take()) == {2: ["s2"]}  # the flood's window is full: its turn passes
    inbox.sequenced(1100)
    inbox.wake = trio.Event()
    inbox.resume()
    assert not inbox.wake.is_set()  # nothing may be taken: no cycle spins for nothing
    applied[0] = 1000  # the first turn's log applied: the window has room again
    inbox.resume()
    assert inbox.wake.is_set()
    assert split(inbox.take()) == {1: [("f", 1)]}
    inbox.sequenced(1200)
    now[0] = 1.0  # long after the small sender's last message: a lone sender again
    applied[0] = 0
    taken = split(inbox.take())
    assert taken == {1: [("f", 2)]}  # not held by its window


def test_bulk_writers_alone_have_no_windows_a_light_one_brings_them() -> None:
    """Windows protect a light connection (one whose turn takes all it has, under half
    a quantum) from heavy ones; among heavy connections only (bulk writers, each with
    more waiting than a turn takes) nobody is behind a flood but its own, and windows
    would only keep the log pipeline short of work (they halved 1 KiB throughput)."""
    now = [0.0]
    inbox = IngressInbox(quantum=4096, window=4096, clock=lambda: now[0], applied=lambda: 0)
    bulk = [queue(1), queue(2)]
    for q in bulk:
        for n in range(16):
            inbox.add(q, [(q.source.conn_id, n)], 4096)
    for position in range(1000, 5000, 1000):
        taken = split(inbox.take())
        assert sorted(taken) == [1, 2]  # both take a turn each cycle: no window binds
        inbox.sequenced(position)
    assert not inbox.contended
    inbox.wake = trio.Event()
    inbox.resume()
    assert inbox.wake.is_set()  # their windows are over-full, but no window binds
    light = queue(3)
    inbox.add(light, ["l1"], 60)
    assert sorted(split(inbox.take())) == [1, 2, 3]  # its turn took all it had: light
    inbox.sequenced(5000)
    assert inbox.contended
    inbox.add(light, ["l2"], 60)
    assert split(inbox.take()) == {3: ["l2"]}  # the bulk writers' windows are full
    now[0] = 1.0  # the light connection has not sent for longer than the window
    assert not inbox.contended
    assert sorted(split(inbox.take())) == [1, 2]


async def test_a_lone_sender_is_handled_at_once_and_several_senders_together() -> None:
    """notify_soon: while one client connection sends alone, each reader runs the duty
    cycle itself, at once (two readers of one pass: two cycles); once two connections
    send within a few ms of each other, the first reader of a pass yields and runs one
    cycle for every reader of that pass, until they have not for a while."""
    now = [0.0]
    inbox = IngressInbox(clock=lambda: now[0])
    cycles: list[float] = []
    inbox.process = lambda: cycles.append(now[0])
    a, b = queue(1), queue(2)

    async def same_pass() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inbox.notify_soon)  # two member links' readers
            nursery.start_soon(inbox.notify_soon)

    await inbox.notify_soon(a)
    await inbox.notify_soon(a)
    await same_pass()
    assert len(cycles) == 4  # alone: each at once, none batched
    now[0] = 0.001
    await inbox.notify_soon(b)  # a second connection, 1 ms after the first
    await same_pass()
    assert len(cycles) == 6  # b's, then one for both readers of the pass
    now[0] = 0.1
    await same_pass()
    assert len(cycles) == 7  # still several
    now[0] = 0.5
    await same_pass()
    assert len(cycles) == 9  # quiet for longer than the contention window: alone again

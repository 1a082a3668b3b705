"""The connection gate's eviction (issue 33): a gate made with ``evict_oldest`` closes
its oldest connection for a new one rather than refusing the new one."""

from __future__ import annotations

import trio
import trio.testing

from cluster.transport.gate import ConnectionGate


class Conn:
    """A stand-in for an accepted stream: the gate only keys on its identity."""


def test_a_full_gate_refuses_the_newcomer_by_default() -> None:
    gate = ConnectionGate("port", 2, 2)
    a, b, c = Conn(), Conn(), Conn()
    assert gate.hold(a, "10.0.0.1")
    assert gate.hold(b, "10.0.0.2")
    assert not gate.hold(c, "10.0.0.3")
    assert (gate.open, gate.refused, gate.evicted) == (2, 1, 0)


async def test_a_full_evicting_gate_closes_its_oldest_for_the_newcomer() -> None:
    gate = ConnectionGate("port", 2, 2, evict_oldest=True)
    a, b, c, d = Conn(), Conn(), Conn(), Conn()
    assert gate.hold(a, "10.0.0.1")
    assert gate.hold(b, "10.0.0.2")
    scope_a, scope_b = gate.guard(a), gate.guard(b)
    assert gate.hold(c, "10.0.0.3")
    assert scope_a.cancel_called
    assert not scope_b.cancel_called
    assert (gate.open, gate.refused, gate.evicted) == (2, 0, 1)
    assert gate.by_address == {"10.0.0.2": 1, "10.0.0.3": 1}
    gate.release(a)  # its handler unwinds: nothing more to give back
    assert gate.open == 2
    # a link that said who it is gives its slot back: it can no longer be evicted
    gate.release(b)
    assert gate.hold(d, "10.0.0.4")
    assert not scope_b.cancel_called
    assert gate.evicted == 1


async def test_a_connection_evicted_before_its_handler_began_is_closed_at_once() -> None:
    gate = ConnectionGate("port", 1, 1, evict_oldest=True)
    a, b = Conn(), Conn()
    assert gate.hold(a, "10.0.0.1")
    assert gate.hold(b, "10.0.0.1")
    assert gate.guard(a).cancel_called
    assert not gate.guard(b).cancel_called


def test_an_evicted_handler_is_cancelled() -> None:
    async def main() -> None:
        gate = ConnectionGate("port", 1, 1, evict_oldest=True)
        a, b = Conn(), Conn()
        ended: list[str] = []

        async def handler(conn: Conn, name: str) -> None:
            try:
                with gate.guard(conn):
                    await trio.sleep_forever()
                ended.append(name)
            finally:
                gate.release(conn)

        async with trio.open_nursery() as nursery:
            assert gate.hold(a, "10.0.0.1")
            nursery.start_soon(handler, a, "a")
            await trio.testing.wait_all_tasks_blocked()
            assert gate.hold(b, "10.0.0.2")
            await trio.testing.wait_all_tasks_blocked()
            assert ended == ["a"]
            assert gate.open == 1
            nursery.cancel_scope.cancel()

    trio.run(main)

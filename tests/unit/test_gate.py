"""The connection gate's eviction (issues 33 and 41): a full gate makes room for a
newcomer from an address holding fewer strangers by closing the oldest stranger of the
address holding the most; a proven connection keeps its room; a gate made with
``evict_oldest`` closes its oldest stranger of any address."""

from __future__ import annotations

import trio
import trio.testing

from cluster.transport.gate import ConnectionGate


class Conn:
    """A stand-in for an accepted stream: the gate only keys on its identity."""


def test_a_full_gate_refuses_a_newcomer_whose_address_holds_as_many_as_any() -> None:
    gate = ConnectionGate("port", 2, 2)
    a, b, c = Conn(), Conn(), Conn()
    assert gate.hold(a, "10.0.0.1")
    assert gate.hold(b, "10.0.0.1")
    assert not gate.hold(c, "10.0.0.1")  # its own share
    assert (gate.open, gate.refused, gate.evicted) == (2, 1, 0)
    gate = ConnectionGate("port", 2, 2)
    assert gate.hold(a, "10.0.0.1")
    assert gate.hold(b, "10.0.0.2")
    d = Conn()
    assert gate.hold(c, "10.0.0.3")  # 0 < 1: the oldest of 10.0.0.1 makes room
    assert not gate.hold(d, "10.0.0.3")  # now as many as any: refused
    assert (gate.open, gate.refused, gate.evicted) == (2, 1, 1)
    assert gate.by_address == {"10.0.0.2": 1, "10.0.0.3": 1}


async def test_a_flood_from_many_addresses_keeps_no_newcomer_out() -> None:
    """Four addresses holding their share (a quarter) fill the port: a client from a
    fifth still gets a slot, and the flood's own new connections push out only the
    flood's old ones, never the client's."""
    gate = ConnectionGate("port", 16)
    flood = {f"10.0.0.{i}": [Conn() for _ in range(4)] for i in range(1, 5)}
    for address, conns in flood.items():
        assert all(gate.hold(c, address) for c in conns)
    assert gate.open == 16
    scopes = {id(c): gate.guard(c) for conns in flood.values() for c in conns}
    client = Conn()
    assert gate.hold(client, "10.0.0.9")
    client_scope = gate.guard(client)
    assert gate.evicted == 1
    assert scopes[id(flood["10.0.0.1"][0])].cancel_called  # the oldest of a top address
    for i in range(40):  # the flood dials again and again, from its four addresses
        gate.hold(Conn(), f"10.0.0.{1 + i % 4}")
    assert not client_scope.cancel_called
    assert gate.open == 16
    assert gate.by_address["10.0.0.9"] == 1


async def test_a_proven_connection_keeps_its_room() -> None:
    """A proven connection holds its slot (a descriptor) but is never closed for a
    newcomer and counts no more against its address's share."""
    gate = ConnectionGate("port", 2, 2)
    a, b, c, d = Conn(), Conn(), Conn(), Conn()
    assert gate.hold(a, "10.0.0.1")
    scope_a = gate.guard(a)
    gate.prove(a)
    assert gate.is_proven(a)
    assert (gate.open, gate.proven, gate.by_address) == (1, 1, {})
    assert gate.hold(b, "10.0.0.2")
    scope_b = gate.guard(b)
    assert gate.hold(c, "10.0.0.3")  # full: the stranger b made room, not a
    assert scope_b.cancel_called
    assert not scope_a.cancel_called
    gate.prove(c)
    assert not gate.hold(d, "10.0.0.4")  # every slot proven: refused
    assert (gate.open, gate.proven, gate.refused, gate.evicted) == (2, 2, 1, 1)
    gate.release(b)  # its handler unwinds: it gave its slot up when evicted
    gate.release(a)
    assert (gate.open, gate.proven) == (1, 1)
    assert gate.hold(d, "10.0.0.4")
    gate.release(c)
    gate.release(d)
    assert (gate.open, gate.proven, gate.by_address) == (0, 0, {})


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

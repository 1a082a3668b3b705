"""SimNetwork: the in-memory, fault-injecting network of the deterministic simulator.

Every async test takes pytest-trio's ``autojump_clock`` (virtual time), so sleeps and
latencies cost no wall time.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from cluster.transport.sim import SimNetwork


async def _idle(stream: trio.abc.Stream) -> None:
    await trio.sleep_forever()


async def _serve(nursery: trio.Nursery, net: SimNetwork, host: str, port: int, handler: Any) -> int:
    return int(await nursery.start(net.host(host).serve, host, port, handler))


async def _collect(stream: trio.abc.Stream, into: bytearray) -> None:
    while data := await stream.receive_some():
        into += data


async def test_bytes_arrive_in_order_and_may_coalesce(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = SimNetwork(random.Random(1), latency=(0.001, 0.050))
    got = bytearray()
    accepted: list[trio.abc.Stream] = []

    async def handler(stream: trio.abc.Stream) -> None:
        accepted.append(stream)
        await _collect(stream, got)

    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 7000, handler)
        stream = await net.host("a").open_stream("b", 7000)
        sent = bytearray()
        for i in range(300):
            chunk = f"<{i}>".encode()
            sent += chunk
            await stream.send_all(chunk)
            if i % 7 == 0:
                await trio.sleep(0.003)
        await stream.aclose()
        await trio.sleep(1)
        assert bytes(got) == bytes(sent)
        assert net.stats["chunks"] == 300
        nursery.cancel_scope.cancel()


async def test_latency_is_applied_to_connects_and_chunks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = SimNetwork(random.Random(2), latency=(0.1, 0.1))
    arrivals: list[float] = []

    async def handler(stream: trio.abc.Stream) -> None:
        while await stream.receive_some():
            arrivals.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 7000, handler)
        start = trio.current_time()
        stream = await net.host("a").open_stream("b", 7000)
        assert trio.current_time() - start == pytest.approx(0.2)  # a round trip
        sent_at = trio.current_time()
        await stream.send_all(b"x")
        await trio.sleep(0.05)
        await stream.send_all(b"y")
        await trio.sleep(1)
        assert arrivals == pytest.approx([sent_at + 0.1, sent_at + 0.15])
        nursery.cancel_scope.cancel()


async def test_fifo_even_when_a_later_chunk_draws_less_latency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = SimNetwork(random.Random(3))
    net.set_latency("a", "b", (0.5, 0.5))
    async with trio.open_nursery() as nursery:
        got = bytearray()
        await _serve(nursery, net, "b", 1, lambda s: _collect(s, got))
        stream = await net.host("a").open_stream("b", 1)
        await stream.send_all(b"first")
        net.set_latency("a", "b", (0.001, 0.001))
        await stream.send_all(b"second")
        await trio.sleep(0.1)
        assert got == b""  # "second" may not overtake "first"
        await trio.sleep(0.5)
        assert got == b"firstsecond"
        nursery.cancel_scope.cancel()


async def test_close_sends_eof_after_the_data(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(4))
    async with trio.open_nursery() as nursery:
        accepted: list[trio.abc.Stream] = []

        async def handler(stream: trio.abc.Stream) -> None:
            accepted.append(stream)
            await trio.sleep_forever()

        await _serve(nursery, net, "b", 1, handler)
        client = await net.host("a").open_stream("b", 1)
        await trio.testing.wait_all_tasks_blocked()
        (server,) = accepted
        await server.send_all(b"bye")
        await server.aclose()
        assert await client.receive_some() == b"bye"
        assert await client.receive_some() == b""
        with pytest.raises(trio.ClosedResourceError):
            await server.send_all(b"more")
        with pytest.raises(trio.BrokenResourceError):
            await client.send_all(b"to a closed socket")
        nursery.cancel_scope.cancel()


async def test_aclose_wakes_a_waiting_receiver(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(5))
    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 1, _idle)
        stream = await net.host("a").open_stream("b", 1)
        raised: list[BaseException] = []

        async def reader() -> None:
            try:
                await stream.receive_some()
            except trio.ClosedResourceError as exc:
                raised.append(exc)

        nursery.start_soon(reader)
        await trio.sleep(1)
        await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert len(raised) == 1
        nursery.cancel_scope.cancel()


async def test_refused_unreachable_and_port_in_use(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(6))
    net.host("b")
    with pytest.raises(OSError, match="refused"):
        await net.host("a").open_stream("b", 1)
    with pytest.raises(OSError, match="no route"):
        await net.host("a").open_stream("nowhere", 1)
    async with trio.open_nursery() as nursery:
        assert await _serve(nursery, net, "b", 0, lambda s: s.aclose()) >= 49152
        await _serve(nursery, net, "b", 1, lambda s: s.aclose())
        with pytest.raises(OSError, match="in use"):
            await _serve(nursery, net, "b", 1, lambda s: s.aclose())
        with pytest.raises(OSError, match="cannot bind"):
            await net.host("b").serve("c", 2, lambda s: s.aclose())
        nursery.cancel_scope.cancel()


async def test_partition_breaks_connections_and_blocks_connects_until_heal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = SimNetwork(random.Random(7), connect_timeout=2.0)
    errors: list[str] = []

    async def handler(stream: trio.abc.Stream) -> None:
        try:
            while await stream.receive_some():
                pass
        except trio.BrokenResourceError:
            errors.append(f"server end of {stream}")

    async with trio.open_nursery() as nursery:
        for host in ("n0", "n1", "n2"):
            await _serve(nursery, net, host, 9020, handler)
        a = await net.host("n0").open_stream("n1", 9020)
        b = await net.host("n1").open_stream("n2", 9020)
        c = await net.host("client").open_stream("n0", 9020)
        await a.send_all(b"in flight")
        net.partition(["n0"], ["n1", "n2"])
        await trio.sleep(0.1)
        assert len(errors) == 1  # only n0 <-> n1 was cut; the receive in progress woke
        with pytest.raises(trio.BrokenResourceError):
            await a.send_all(b"x")
        with pytest.raises(trio.BrokenResourceError):
            await a.receive_some()
        await b.send_all(b"still fine")
        await c.send_all(b"clients not named in a group talk to everyone")
        start = trio.current_time()
        with pytest.raises(OSError, match="timed out"):
            await net.host("n2").open_stream("n0", 9020)
        assert trio.current_time() - start == pytest.approx(2.0)
        assert not net.can_talk("n0", "n2")
        net.heal()
        a2 = await net.host("n0").open_stream("n1", 9020)
        await a2.send_all(b"after heal")
        await trio.sleep(0.1)
        assert net.connections() == 3
        net.isolate("n1")
        await trio.sleep(0.1)
        assert net.connections("n1") == 0
        assert net.connections() == 1  # client -> n0
        nursery.cancel_scope.cancel()


async def test_one_way_holds_one_direction_only(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(8), connect_timeout=1.0)
    to_b = bytearray()
    accepted: list[trio.abc.Stream] = []

    async def handler(stream: trio.abc.Stream) -> None:
        accepted.append(stream)
        await _collect(stream, to_b)

    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 1, handler)
        stream = await net.host("a").open_stream("b", 1)
        await trio.testing.wait_all_tasks_blocked()
        net.one_way("a", "b")
        await stream.send_all(b"held")  # accepted...
        await accepted[0].send_all(b"back")
        assert await stream.receive_some() == b"back"  # b -> a still flows
        await trio.sleep(30)
        assert to_b == b""  # ...but never delivered while the blackhole lasts
        with pytest.raises(OSError, match="timed out"):
            await net.host("a").open_stream("b", 1)
        with pytest.raises(OSError, match="timed out"):
            await net.host("b").open_stream("a", 1)
        net.heal()
        await trio.sleep(0.1)
        assert to_b == b"held"  # TCP retransmits once the path is back
        nursery.cancel_scope.cancel()


async def test_clog_holds_delivery_then_releases(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(9), latency=(0.01, 0.01))
    got = bytearray()
    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 1, lambda s: _collect(s, got))
        stream = await net.host("a").open_stream("b", 1)
        net.clog("b", 2.0)
        start = trio.current_time()
        await stream.send_all(b"late")
        await trio.sleep(1.9)
        assert got == b""
        await trio.sleep(0.2)
        assert got == b"late"
        assert trio.current_time() - start < 2.2
        nursery.cancel_scope.cancel()


async def test_crash_breaks_connections_and_refuses_until_it_serves_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = SimNetwork(random.Random(10))
    broken: list[str] = []

    async def handler(stream: trio.abc.Stream) -> None:
        try:
            await stream.receive_some()
        except trio.BrokenResourceError:
            broken.append("server")

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as node:
            await _serve(node, net, "n0", 9010, handler)
            stream = await net.host("c").open_stream("n0", 9010)
            net.crash("n0")
            await trio.testing.wait_all_tasks_blocked()
            node.cancel_scope.cancel()
        assert broken == ["server"]
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some()
        assert not net.listening("n0", 9010)
        with pytest.raises(OSError, match="refused"):
            await net.host("c").open_stream("n0", 9010)
        await _serve(outer, net, "n0", 9010, handler)  # restarted
        await net.host("c").open_stream("n0", 9010)
        outer.cancel_scope.cancel()


async def test_random_resets_break_both_ends(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(11), reset_probability=1.0)
    broken: list[str] = []

    async def handler(stream: trio.abc.Stream) -> None:
        try:
            await stream.receive_some()
        except trio.BrokenResourceError:
            broken.append("server")

    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 1, handler)
        stream = await net.host("a").open_stream("b", 1)
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"x")
        await trio.testing.wait_all_tasks_blocked()
        assert broken == ["server"]
        assert net.stats["resets"] == 1
        nursery.cancel_scope.cancel()


async def test_concurrent_receives_are_an_error(autojump_clock: trio.testing.MockClock) -> None:
    net = SimNetwork(random.Random(12))
    async with trio.open_nursery() as nursery:
        await _serve(nursery, net, "b", 1, _idle)
        stream = await net.host("a").open_stream("b", 1)
        nursery.start_soon(stream.receive_some)
        await trio.sleep(0.1)
        with pytest.raises(trio.BusyResourceError):
            await stream.receive_some()
        nursery.cancel_scope.cancel()


def _traffic(seed: int) -> tuple[str, list[tuple[Any, ...]]]:
    """Several hosts chatter at random under faults; return the network's trace."""
    import trio._core._run as trio_run

    async def main() -> tuple[str, list[tuple[Any, ...]]]:
        rng = random.Random(seed)
        net = SimNetwork(
            random.Random(rng.getrandbits(64)),
            latency=(0.001, 0.02),
            reset_probability=0.01,
            keep_trace=True,
        )
        hosts = [f"h{i}" for i in range(4)]

        async def sink(stream: trio.abc.Stream) -> None:
            try:
                while await stream.receive_some():
                    pass
            except trio.BrokenResourceError:
                pass

        async def talker(me: str, trng: random.Random) -> None:
            for _ in range(40):
                peer = trng.choice([h for h in hosts if h != me])
                try:
                    stream = await net.host(me).open_stream(peer, 1)
                    for _ in range(trng.randrange(1, 5)):
                        await stream.send_all(trng.randbytes(trng.randrange(1, 50)))
                        await trio.sleep(trng.uniform(0, 0.01))
                    await stream.aclose()
                except (OSError, trio.BrokenResourceError):
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            for h in hosts:
                await nursery.start(net.host(h).serve, h, 1, sink)
            async with trio.open_nursery() as talkers:
                for h in hosts:
                    talkers.start_soon(talker, h, random.Random(rng.getrandbits(64)))
                await trio.sleep(0.2)
                net.partition(["h0", "h1"], ["h2", "h3"])
                await trio.sleep(0.3)
                net.heal()
                net.one_way("h1", "h2")
                net.clog("h3", 0.1)
            nursery.cancel_scope.cancel()
        return net.trace_hash, net.trace

    saved = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)
    try:
        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved  # type: ignore[misc]


def test_same_seed_same_delivery_trace() -> None:
    first, trace = _traffic(42)
    second, _ = _traffic(42)
    assert first == second
    assert any(e[1] == "deliver" for e in trace)
    assert any(e[1] == "break" for e in trace)
    assert _traffic(43)[0] != first

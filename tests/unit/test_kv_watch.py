"""The KV example's queries and watches (issue 43), the service alone and the client's
receive loop against a fake session: ``get`` is answered by ``on_query`` (read-only), a
``Watch`` registers (session, prefix) in the state and in the snapshot, every change under
the prefix gives that session one ``Change`` in log order, and the client hands changes to
their watches without disturbing the matching of responses to requests."""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec
import pytest
import trio

from client import ServiceError
from cluster.examples.kv import (
    CHANGE_PREFIX,
    MAX_WATCHES,
    Change,
    CompareAndSet,
    Delete,
    Get,
    KeyChange,
    KeyValueClient,
    KeyValueService,
    Put,
    Response,
    Unwatch,
    Watch,
    WatchLostError,
    WatchOverflowError,
    _Snapshot,
    _SnapshotV1,
    _SnapshotV2,
)
from cluster.protocol.enums import CloseReason

encode = msgspec.msgpack.Encoder().encode
decode_response = msgspec.msgpack.Decoder(Response).decode
decode_change = msgspec.msgpack.Decoder(Change).decode


class Session:
    def __init__(self, session_id: int) -> None:
        self.id = session_id
        self.replies: list[bytes] = []

    def offer(self, payload: bytes) -> bool:
        self.replies.append(payload)
        return True

    def changes(self) -> list[Change]:
        return [decode_change(r) for r in self.replies if r[:8] == CHANGE_PREFIX]

    def responses(self) -> list[Response]:
        return [decode_response(r) for r in self.replies if r[:8] != CHANGE_PREFIX]


class FakeCluster:
    """The Cluster handle: sessions by id, the log position, timers."""

    def __init__(self, *sessions: Session) -> None:
        self.sessions = {s.id: s for s in sessions}
        self.log_position = 0
        self.timers: dict[int, int] = {}

    def get_client_session(self, session_id: int) -> Session | None:
        return self.sessions.get(session_id)

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        self.timers[correlation_id] = deadline
        return True

    def cancel_timer(self, correlation_id: int) -> bool:
        return self.timers.pop(correlation_id, None) is not None


def started(*sessions: Session, snapshot: bytes | None = None) -> tuple[KeyValueService, Any]:
    cluster = FakeCluster(*sessions)
    service = KeyValueService()
    service.on_start(cluster, snapshot)  # type: ignore[arg-type]
    return service, cluster


def apply(service: KeyValueService, cluster: FakeCluster, session: Session, request: Any) -> None:
    """One log entry: the position moves by 100 each time (any increasing number)."""
    cluster.log_position += 100
    service.on_session_message(session, cluster.log_position * 10, encode(request))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the service


def test_a_get_is_a_read_only_query_and_an_old_get_through_the_log_still_answers() -> None:
    alice = Session(1)
    service, cluster = started(alice)
    apply(service, cluster, alice, Put(1, "k", b"v"))
    before = service.on_take_snapshot()
    assert decode_response(service.on_query(encode(Get(7, "k")))) == Response(7, True, b"v")
    assert decode_response(service.on_query(encode(Get(8, "nope")))) == Response(8, False)
    assert service.on_take_snapshot() == before  # the query changed nothing
    with pytest.raises(ValueError, match="only a Get is a query, not Put"):
        service.on_query(encode(Put(9, "k", b"w")))
    with pytest.raises(msgspec.DecodeError):
        service.on_query(b"\xc1")
    assert service.store == {"k": b"v"}
    apply(service, cluster, alice, Get(2, "k"))  # a client from before queries
    assert alice.responses()[-1] == Response(2, True, b"v")


def test_a_watch_sees_each_change_under_its_prefix_once_in_log_order() -> None:
    alice, bob = Session(1), Session(2)
    service, cluster = started(alice, bob)
    apply(service, cluster, bob, Put(1, "a/early", b"0"))  # before the watch: not seen
    apply(service, cluster, alice, Watch(10, "a/"))
    assert alice.responses() == [Response(10, True)]
    apply(service, cluster, bob, Put(2, "a/x", b"1"))  # position 300
    apply(service, cluster, bob, Put(3, "b/x", b"2"))  # not under a/
    apply(service, cluster, bob, CompareAndSet(4, "a/x", b"wrong", b"3"))  # fails: no change
    apply(service, cluster, bob, CompareAndSet(5, "a/x", b"1", b"3"))  # position 600
    apply(service, cluster, bob, Delete(6, "a/missing"))  # nothing deleted: no change
    apply(service, cluster, bob, Delete(7, "a/x"))  # position 800
    apply(service, cluster, bob, Put(8, "a/y", b"4", ttl_ms=50))  # position 900
    (timer,) = cluster.timers
    cluster.log_position = 1000
    service.on_timer_event(timer, 10_000)  # the TTL expired: a deletion
    assert [(c.watch_ids, c.key, c.value, c.position) for c in alice.changes()] == [
        ([10], "a/x", b"1", 300),
        ([10], "a/x", b"3", 600),
        ([10], "a/x", None, 800),
        ([10], "a/y", b"4", 900),
        ([10], "a/y", None, 1000),
    ]
    assert alice.changes()[0].timestamp == 3000
    assert bob.changes() == []
    assert len(bob.responses()) == 8  # each request answered once, as before


def test_one_change_per_session_names_every_watch_it_matches_and_unwatch_ends_one() -> None:
    alice = Session(1)
    service, cluster = started(alice)
    apply(service, cluster, alice, Watch(1, ""))
    apply(service, cluster, alice, Watch(2, "a/"))
    apply(service, cluster, alice, Put(3, "a/k", b"v"))
    apply(service, cluster, alice, Put(4, "z", b"v"))
    assert [(c.watch_ids, c.key) for c in alice.changes()] == [([1, 2], "a/k"), ([1], "z")]
    apply(service, cluster, alice, Unwatch(5, 1))
    apply(service, cluster, alice, Unwatch(6, 1))  # already gone
    assert [r.ok for r in alice.responses()][-2:] == [True, False]
    apply(service, cluster, alice, Put(7, "a/k", b"w"))
    apply(service, cluster, alice, Put(8, "z", b"w"))
    assert [(c.watch_ids, c.key) for c in alice.changes()[2:]] == [([2], "a/k")]
    apply(service, cluster, alice, Unwatch(9, 2))
    assert service.watches == {}


def test_a_session_closed_or_gone_is_forgotten_and_watches_are_bounded() -> None:
    alice, bob = Session(1), Session(2)
    service, cluster = started(alice, bob)
    apply(service, cluster, alice, Watch(1, ""))
    apply(service, cluster, bob, Watch(1, ""))
    service.on_session_close(alice, 0, CloseReason.CLIENT_ACTION)  # type: ignore[arg-type]
    assert list(service.watches) == [2]
    del cluster.sessions[2]  # not there any more: dropped at the next change
    apply(service, cluster, alice, Put(2, "k", b"v"))
    assert service.watches == {}
    for i in range(MAX_WATCHES):
        apply(service, cluster, alice, Watch(10 + i, f"p{i}"))
    apply(service, cluster, alice, Watch(99, "more"))
    assert alice.responses()[-1] == Response(
        99, False, None, f"at most {MAX_WATCHES} watches per session"
    )


def test_watches_are_in_the_snapshot_and_older_layouts_still_load() -> None:
    alice = Session(1)
    service, cluster = started(alice)
    apply(service, cluster, alice, Put(1, "k", b"v", ttl_ms=1000))
    apply(service, cluster, alice, Watch(2, "k"))
    snapshot = service.on_take_snapshot()
    assert msgspec.msgpack.decode(snapshot)[0] == 3  # the layout's tag
    restored, cluster2 = started(alice, snapshot=snapshot)
    assert restored.watches == {1: {2: "k"}}
    assert restored.store == {"k": b"v"}
    apply(restored, cluster2, alice, Put(3, "k", b"w"))
    assert [(c.watch_ids, c.value) for c in alice.changes()] == [([2], b"w")]
    v2 = encode(_SnapshotV2({"a": b"1"}, {4: "a"}, 5))
    older, _ = started(snapshot=v2)
    assert (older.store, older.watches, older._next_timer_id) == ({"a": b"1"}, {}, 5)
    v1 = encode(_SnapshotV1({"b": b"2"}, {7: {1: b"x"}}, {}, 3))
    oldest, _ = started(snapshot=v1)
    assert (oldest.store, oldest.watches) == ({"b": b"2"}, {})
    assert isinstance(msgspec.msgpack.decode(snapshot, type=_Snapshot), _Snapshot)


# ---------------------------------------------------------------------- the client


class FakeClient:
    """A ClusterClient whose egress the test feeds; ``offers`` are the requests sent,
    ``answer`` the query's answer."""

    def __init__(self) -> None:
        self.inbox: deque[bytes | BaseException] = deque()
        self.offers: list[Any] = []
        self.queries: list[tuple[bytes, str]] = []
        self.replies_dropped = 0
        self.is_closed = False
        self._more = trio.Event()
        self.service = KeyValueService()

    def feed(self, item: bytes | BaseException) -> None:
        self.inbox.append(item)
        self._more.set()

    async def receive(self) -> bytes:
        while not self.inbox:
            self._more = trio.Event()
            await self._more.wait()
        item = self.inbox.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    async def offer(self, payload: bytes) -> None:
        self.offers.append(msgspec.msgpack.decode(payload))

    async def query(self, payload: bytes, *, consistency: str) -> bytes:
        self.queries.append((payload, consistency))
        return self.service.on_query(payload)


def change(ids: list[int], key: str, value: bytes | None, position: int) -> bytes:
    return encode(Change(ids, key, value, position, 0))


async def wait_for(predicate: Any) -> None:
    with trio.fail_after(5):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.001)


async def test_get_is_a_query_with_the_consistency_asked() -> None:
    fake = FakeClient()
    fake.service.store["k"] = b"v"
    async with KeyValueClient(fake) as kv:  # type: ignore[arg-type]
        assert await kv.get("k") == b"v"
        assert await kv.get("nope", consistency="follower") is None
        with pytest.raises(TypeError, match="a key is a str"):
            await kv.get(b"k")  # type: ignore[arg-type]
    assert [c for _, c in fake.queries] == ["linearizable", "follower"]
    assert msgspec.msgpack.decode(fake.queries[0][0]) == ["get", 0, "k"]
    assert fake.offers == []  # nothing through the log


async def test_changes_go_to_their_watch_and_responses_still_match_their_requests() -> None:
    fake = FakeClient()
    seen: list[KeyChange] = []
    async with KeyValueClient(fake) as kv, trio.open_nursery() as nursery:  # type: ignore[arg-type]

        async def watch(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            async with kv.watch("a/") as changes:
                task_status.started()
                async for item in changes:
                    seen.append(item)
                    if len(seen) == 3:
                        return

        async def registered() -> None:
            await wait_for(lambda: fake.offers)
            assert fake.offers[0] == ["watch", 1, "a/"]
            fake.feed(change([1], "a/early", b"0", 5))  # the receive loop may be first
            fake.feed(encode(Response(1, True)))

        nursery.start_soon(registered)
        await nursery.start(watch)
        put_done = trio.Event()

        async def put() -> None:
            await kv.put("a/k", b"v")
            put_done.set()

        nursery.start_soon(put)
        await wait_for(lambda: len(fake.offers) == 2)
        # a change between the put and its response does not answer the put
        fake.feed(change([1], "a/k", b"v", 10))
        fake.feed(change([1], "a/k", None, 11))
        await wait_for(lambda: len(seen) == 3)
        assert not put_done.is_set()
        fake.feed(encode(Response(2, True)))
        await put_done.wait()
        await wait_for(lambda: len(fake.offers) == 3)
        assert fake.offers[2] == ["unwatch", 3, 1]  # leaving the block unwatches
        fake.feed(encode(Response(3, True)))  # nobody waits for it: not unmatched
        fake.feed(change([1], "a/late", b"x", 12))  # after the watch closed: stray
        await wait_for(lambda: kv.stray_changes == 1)
        assert kv.unmatched == 0
    assert [(c.key, c.value, c.position, c.deleted) for c in seen] == [
        ("a/early", b"0", 5, False),
        ("a/k", b"v", 10, False),
        ("a/k", None, 11, True),
    ]


async def start_watch(fake: FakeClient, kv: KeyValueClient, **kwargs: Any) -> Any:
    watcher = kv.watch("", **kwargs)

    async def answer() -> None:
        await wait_for(lambda: fake.offers)
        fake.feed(encode(Response(fake.offers[-1][1], True)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        await watcher.__aenter__()
    return watcher


async def test_an_unconsumed_watch_fails_past_its_bound_without_holding_up_responses() -> None:
    fake = FakeClient()
    fake.service.store["k"] = b"v"
    async with KeyValueClient(fake) as kv:  # type: ignore[arg-type]
        watcher = await start_watch(fake, kv, max_buffered=3)
        for i in range(5):
            fake.feed(change([1], f"k{i}", b"x", 100 + i))
        fake.feed(encode(Response(99, True)))  # a response after them is still read
        await wait_for(lambda: kv.unmatched == 1)
        assert await kv.get("k") == b"v"
        got = await drained(watcher, WatchOverflowError)
        assert got == [100, 101, 102]  # everything kept is yielded, then the error
        assert "changes after log position 102 were not kept" in str(watcher.state.error)
        await watcher.__aexit__(None, None, None)


async def drained(watcher: Any, error: type[BaseException]) -> list[int]:
    """The positions a watch yields until it raises ``error`` (which it must)."""
    got: list[int] = []
    try:
        async for item in watcher:
            got.append(item.position)
    except error:
        return got
    raise AssertionError(f"the watch ended without {error.__name__}")


async def test_replies_dropped_by_the_cluster_stop_every_watch() -> None:
    fake = FakeClient()
    async with KeyValueClient(fake) as kv:  # type: ignore[arg-type]
        watcher = await start_watch(fake, kv)
        fake.feed(change([1], "k", b"1", 10))
        await wait_for(lambda: watcher.state.buffer)
        fake.replies_dropped = 2  # a gap before the next reply
        fake.feed(change([1], "k", b"3", 30))
        got = await drained(watcher, WatchLostError)
        assert got == [10]
        assert "dropped 2 replies" in str(watcher.state.error)


async def test_a_closed_session_ends_the_watch_with_its_error() -> None:
    fake = FakeClient()
    async with KeyValueClient(fake) as kv:  # type: ignore[arg-type]
        watcher = await start_watch(fake, kv)
        fake.feed(change([1], "k", b"1", 10))
        fake.feed(ServiceError("ValueError", "x", 5, 0, b""))  # for no request: skipped
        fake.feed(RuntimeError("session closed"))
        got = await drained(watcher, RuntimeError)
        assert got == [10]
        await watcher.__aexit__(None, None, None)  # nothing to unwatch: no session
    assert len(fake.offers) == 1
    with pytest.raises(RuntimeError, match="inside its block"):
        await watcher.__anext__()

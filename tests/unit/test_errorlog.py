"""The distinct error log (``cluster.errorlog``): one entry per distinct error, with a
count and first and last times, bounded in entries and bytes whatever is logged; and the
admin server's ``errors`` answering from it, with or without ``main()``'s process log."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from cluster import errorlog
from cluster.agents.admin import AdminServer
from cluster.config import NodeConfig
from cluster.errorlog import DistinctErrorLog, normalise
from cluster.protocol.admin import AdminCommand, MemberStatus, decode_body


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("cluster.test_errorlog")
    log.propagate = False  # keep the test's floods out of pytest's capture
    try:
        yield log
    finally:
        log.handlers.clear()
        log.propagate = True


def attach(log: logging.Logger, **limits: int) -> DistinctErrorLog:
    handler = DistinctErrorLog(**limits)
    log.addHandler(handler)
    return handler


def test_numbers_and_addresses_are_masked() -> None:
    assert normalise("session 17 timed out after 10.2 s") == "session # timed out after #.# s"
    assert normalise("bad frame from 127.0.0.1:50312") == normalise("bad frame from 10.0.0.9:1")
    assert normalise("object at 0x7f3a9c2e1b40") == "object at #x"
    assert normalise("token 3fa9c2e1ab") == "token #x"
    assert normalise("deadbeef is a word") == "deadbeef is a word"


def test_repeats_are_one_entry_with_a_count_and_first_and_last_times(
    logger: logging.Logger,
) -> None:
    log = attach(logger)
    for i in range(10_000):
        logger.warning("closing ingress connection from 127.0.0.1:%d after bad frame", 40_000 + i)
    logger.error("disk full: %s", "no space left")
    logger.info("not a warning")
    assert len(log) == 2
    first, second = log.entries()
    assert first.count == 10_000
    assert first.level == "WARNING"
    assert first.logger == "cluster.test_errorlog"
    assert first.message.endswith(":49999 after bad frame")  # the latest text
    assert first.first_time <= first.last_time <= second.first_time
    assert (second.count, second.level) == (1, "ERROR")
    assert log.total == 10_001
    # a repeat of the oldest moves it last (most recently seen)
    logger.warning("closing ingress connection from 127.0.0.1:1 after bad frame")
    assert [e.count for e in log.entries()] == [1, 10_001]


def test_same_text_at_another_level_or_logger_is_another_error(logger: logging.Logger) -> None:
    log = attach(logger)
    logger.warning("x")
    logger.error("x")
    logging.getLogger("cluster.test_errorlog.child").warning("x")
    assert len(log) == 3  # the child's record reaches the parent's handler: its own entry
    assert [e.logger for e in log.entries()][-1] == "cluster.test_errorlog.child"


def test_exceptions_are_told_apart_by_type_and_message(logger: logging.Logger) -> None:
    log = attach(logger)
    for exc in (ValueError("bad 1"), ValueError("bad 2"), KeyError("k"), ValueError("other")):
        try:
            raise exc
        except Exception:
            logger.exception("agent failed")
    entries = log.entries()
    assert [e.count for e in entries] == [2, 1, 1]
    assert "Traceback" in entries[0].message
    assert "ValueError: bad 2" in entries[0].message


def test_a_flood_of_distinct_errors_stays_within_the_entry_limit(logger: logging.Logger) -> None:
    log = attach(logger, max_entries=50)
    rng = random.Random(7)
    for _ in range(5_000):
        word = "".join(rng.choices("ghijklmnopqrstuvwxyz", k=12))
        logger.warning("unknown thing %s", word)
    assert len(log) == 50
    assert log.evicted == 4_950
    assert log.total == 5_000


def test_a_flood_of_long_distinct_errors_stays_within_the_byte_limit(
    logger: logging.Logger,
) -> None:
    log = attach(logger, max_bytes=64 * 1024, max_message=1000)
    rng = random.Random(8)
    for _ in range(300):
        word = "".join(rng.choices("ghijklmnopqrstuvwxyz", k=2_000))
        logger.error("garbage %s", word)
    assert log.bytes <= 64 * 1024
    assert sum(len(e.message) for e in log.entries()) <= 64 * 1024
    assert all(len(e.message) < 1100 for e in log.entries())
    assert all("more characters" in e.message for e in log.entries())
    assert log.evicted > 0
    # the latest distinct errors are the ones kept
    logger.error("the newest one")
    assert log.entries()[-1].message == "the newest one"


def test_records_are_the_admin_reply_shape_newest_last_with_a_limit(
    logger: logging.Logger,
) -> None:
    log = attach(logger)
    for name in ("a", "b", "c"):
        logger.warning("%s happened", name)
    records = log.records()
    assert [r["message"] for r in records] == ["a happened", "b happened", "c happened"]
    assert set(records[0]) == {
        "time", "first_time", "last_time", "count", "level", "logger", "message",
    }  # fmt: skip
    assert records[0]["time"] == records[0]["last_time"]
    assert [r["message"] for r in log.records(2)] == ["b happened", "c happened"]
    assert log.records(0) == []


def test_install_once_on_the_cluster_logger() -> None:
    errorlog.uninstall()
    try:
        first = errorlog.install()
        assert errorlog.install() is first
        assert errorlog.installed() is first
        assert first in logging.getLogger("cluster").handlers
        assert first not in logging.getLogger().handlers  # basicConfig still works
    finally:
        errorlog.uninstall()
    assert errorlog.installed() is None
    assert not any(isinstance(h, DistinctErrorLog) for h in logging.getLogger("cluster").handlers)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        DistinctErrorLog(max_entries=0)


# ---------------------------------------------------------------------- the admin server


class _Target:
    """What AdminServer needs of a node for ``errors``: its status and a network."""

    def __init__(self) -> None:
        self.network = self
        self.config = NodeConfig()
        self.admin_endpoint = ("127.0.0.1", 0)

    def status(self) -> MemberStatus:
        return MemberStatus(member_id=0)

    async def serve(
        self, host: str, port: int, handler: object, *, task_status: trio.TaskStatus[int]
    ) -> None:
        task_status.started(0)
        await trio.sleep_forever()


async def errors_of(server: AdminServer, **args: str) -> Any:
    reply = await server.execute(AdminCommand(1, "errors", args))
    assert reply.ok, reply.message
    return decode_body(reply.body)


async def test_a_node_without_main_has_an_error_log_while_it_serves() -> None:
    errorlog.uninstall()
    server = AdminServer(_Target())  # type: ignore[arg-type]
    assert errorlog.installed() is None
    log = logging.getLogger("cluster.test_errorlog_admin")
    log.warning("before the admin port: not seen by a log of its own")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        for i in range(3):
            log.warning("client %d sent garbage", i)
        records = await errors_of(server)
        assert [(r["count"], r["message"]) for r in records] == [(3, "client 2 sent garbage")]
        summary = await errors_of(server, summary="1", limit="5")
        assert summary == {"entries": records, "distinct": 1, "evicted": 0, "total": 3}
        nursery.cancel_scope.cancel()
    assert server.errors not in logging.getLogger("cluster").handlers  # detached


async def test_the_process_log_has_what_was_logged_before_the_admin_port() -> None:
    errorlog.uninstall()
    process_log = errorlog.install()
    try:
        logging.getLogger("cluster.security").warning("start-up warning")
        server = AdminServer(_Target())  # type: ignore[arg-type]
        assert server.errors is process_log
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            messages = [r["message"] for r in await errors_of(server)]
            assert messages == ["start-up warning"]
            nursery.cancel_scope.cancel()
        assert process_log in logging.getLogger("cluster").handlers  # still installed
        reply = await server.execute(AdminCommand(2, "errors", {"limit": "many"}))
        assert (reply.ok, reply.message) == (False, "bad limit 'many'")
    finally:
        errorlog.uninstall()

"""A service callback's exception does not kill the member (issue 32).

The container catches it on every member alike, moves past the entry, counts it, hands
it to its policy (``continue``: logged once per distinct error; ``stop``:
:class:`ServiceFailure`) and, on the leader only, tells the client whose message it was
(``ServiceErrorEvent``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cluster import errorlog, launch
from cluster.agents.exporter import StatusCollector
from cluster.archive.record import encode_record
from cluster.config import ConfigError, load_config
from cluster.core.base import ConsensusConfig, IngressSource
from cluster.core.consensus import ConsensusModule
from cluster.core.service_container import ServiceContainer
from cluster.core.service_errors import (
    MAX_ERROR_MESSAGE,
    REPEAT_LOG_INTERVAL_NS,
    STOP,
    ServiceErrorPolicy,
    ServiceFailure,
    error_type,
)
from cluster.protocol import encode
from cluster.protocol.admin import MemberStatus
from cluster.protocol.egress import SERVICE_ERROR_REQUEST_BYTES, ServiceErrorEvent
from cluster.protocol.enums import CloseReason, ClusterTimeUnit, Role
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.log import (
    LogMessage,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)
from cluster.service import (
    ClientSession,
    Cluster,
    ClusteredService,
    ServiceStateError,
    take_service_snapshot,
)

SECOND = 1_000_000_000
TERM = 3
SID = 1
T = 1_700_000_000_000  # cluster time, epoch ms


class CustomError(Exception):
    pass


class Fragile(ClusteredService):
    """Echoes ``re:<payload>``; raises ValueError on b"boom" (and on any callback named in
    ``raise_in``)."""

    def __init__(self, *raise_in: str) -> None:
        self.raise_in = set(raise_in)
        self.seen: list[Any] = []
        self.cluster: Cluster | None = None

    def _maybe_raise(self, callback: str) -> None:
        if callback in self.raise_in:
            raise RuntimeError(f"{callback} failed on purpose")

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster
        self._maybe_raise("on_start")

    def on_take_snapshot(self) -> bytes:
        return b""

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if payload == b"boom" or payload.startswith(b"boom "):
            raise ValueError(f"bad payload {payload!r}")
        if payload == b"custom":
            raise CustomError("custom failure")
        if payload == b"long":
            raise ValueError("x" * 5000)
        if payload == b"memory":
            raise MemoryError
        if payload == b"interrupt":
            raise KeyboardInterrupt
        if payload == b"exit":
            raise SystemExit(3)
        if payload == b"genexit":
            raise GeneratorExit
        if payload == b"quit":
            raise Quit("the service quits")
        if session is None:
            self._maybe_raise("service message")
        self.seen.append(payload)
        if session is not None:
            session.offer(b"re:" + payload)

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        self.seen.append(("open", session.id))
        self._maybe_raise("on_session_open")

    def on_session_close(
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        self.seen.append(("close", session.id))
        self._maybe_raise("on_session_close")

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        self.seen.append(("timer", correlation_id))
        self._maybe_raise("on_timer_event")

    def on_new_leadership_term_event(self, event: NewLeadershipTermEvent) -> None:
        self.seen.append(("term", event.leadership_term_id))
        self._maybe_raise("on_new_leadership_term_event")

    def on_role_change(self, new_role: Role) -> None:
        self.seen.append(("role", new_role))
        self._maybe_raise("on_role_change")

    def on_terminate(self, cluster: Cluster) -> None:
        self._maybe_raise("on_terminate")


@dataclass
class Egress:
    sent: list[tuple[int, Any]] = field(default_factory=list)

    def connect(self, egress_id: int, channel: str) -> None:
        pass

    def attach(self, egress_id: int, source: IngressSource) -> None:
        pass

    def reply(self, source: IngressSource, message: Any) -> bool:
        return True

    def send(self, egress_id: int, message: Any) -> bool:
        self.sent.append((egress_id, message))
        return True

    def close(self, egress_id: int) -> None:
        pass

    def errors(self) -> list[ServiceErrorEvent]:
        return [m for _, m in self.sent if isinstance(m, ServiceErrorEvent)]

    def replies(self) -> list[bytes]:
        return [m.payload for _, m in self.sent if isinstance(m, SessionMessageHeader)]


class Member:
    """A container over a real (idle) consensus module, fed hand-made log entries."""

    def __init__(
        self, role: Role = Role.LEADER, policy: str = "continue", service: Fragile | None = None
    ) -> None:
        self.now = 0
        self.egress = Egress()
        self.cm = ConsensusModule(ConsensusConfig(), self.egress)
        self.service = service or Fragile()
        self.container = ServiceContainer(
            self.service,
            self.cm,
            self.egress,
            member_id=0,
            clock_ns=lambda: self.now,
            on_error=ServiceErrorPolicy(policy, lambda: self.now),
        )
        self.container.start(None)
        self.container.set_role(role)

    @property
    def errors(self) -> int:
        return self.cm.counters.service_errors


def term() -> NewLeadershipTermEvent:
    return NewLeadershipTermEvent(TERM, 0, T, 0, 0, 0, ClusterTimeUnit.MILLIS, 1)


def opened(sid: int = SID) -> SessionOpenEvent:
    return SessionOpenEvent(TERM, 7, sid, T, 3, "127.0.0.1:1")


def message(payload: bytes, sid: int = SID, at: int = 0) -> SessionMessageHeader:
    return SessionMessageHeader(TERM, sid, T + at, payload)


def records(*messages: LogMessage) -> tuple[bytes, list[tuple[int, int, LogMessage]]]:
    """The log bytes of ``messages`` from position 0, and its ``(start, end, message)``."""
    data = b""
    spans = []
    for m in messages:
        start = len(data)
        data += encode_record(encode(m))
        spans.append((start, len(data), m))
    return data, spans


GOOD_AND_BAD = (term(), opened(), message(b"a", at=1), message(b"boom", at=2), message(b"b", at=3))


def boom_end() -> int:
    _, spans = records(*GOOD_AND_BAD)
    return spans[3][1]


# ---------------------------------------------------------------------- continue


@pytest.mark.parametrize("path", ["apply", "mirror", "records"])
def test_the_position_advances_past_the_bad_entry_and_the_next_is_applied(path: str) -> None:
    member = Member()
    data, spans = records(*GOOD_AND_BAD)
    if path == "records":  # a leader's own entries of its term
        assert member.container.apply_records(spans, 0) == len(data)
    else:
        consumed = member.container.apply(data, 0, mirror_into_consensus=path == "mirror")
        assert consumed == len(data)
    assert member.container.log_position == len(data)
    assert member.container.time == T + 3
    assert member.service.seen[-2:] == [b"a", b"b"]
    assert member.egress.replies() == [b"re:a", b"re:b"]
    assert member.errors == 1
    assert member.container.applied_messages == 3
    assert SID in member.container.sessions  # the session stays open


def test_the_leader_tells_the_sender_a_follower_does_not() -> None:
    data, _ = records(*GOOD_AND_BAD)
    leader, follower = Member(Role.LEADER), Member(Role.FOLLOWER)
    for member in (leader, follower):
        assert member.container.apply(data, 0) == len(data)
    (event,) = leader.egress.errors()
    assert leader.egress.sent[-2] == (SID, event)  # between the replies to a and b
    assert event == ServiceErrorEvent(
        cluster_session_id=SID,
        leadership_term_id=TERM,
        log_position=boom_end(),
        timestamp=T + 2,
        error_type="ValueError",
        message="bad payload b'boom'",
        request=b"boom",
        reply=2,  # numbered among the replies (exactly once out)
    )
    assert follower.egress.sent == []  # followers send nothing: they keep the replies
    kept = follower.container.sessions[SID].replies.kept
    assert [type(r).__name__ for r in kept] == [
        "SessionMessageHeader",
        "ServiceErrorEvent",
        "SessionMessageHeader",
    ]
    assert kept[1] == event
    # every member raised on the same entry: their states are equal
    assert follower.errors == leader.errors == 1
    applied = [[e for e in m.service.seen if e[0] != "role"] for m in (leader, follower)]
    assert applied[0] == applied[1] == [("term", TERM), ("open", SID), b"a", b"b"]
    assert follower.container.log_position == leader.container.log_position


def test_the_error_names_its_type_and_cuts_message_and_request() -> None:
    member = Member()
    long_request = b"boom " + b"y" * (2 * SERVICE_ERROR_REQUEST_BYTES)
    data, _ = records(term(), opened(), message(b"custom"), message(b"long"), message(long_request))
    member.container.apply(data, 0)
    custom, long, cut = member.egress.errors()
    assert custom.error_type == f"{__name__}.CustomError"
    assert error_type(CustomError()) == f"{__name__}.CustomError"
    assert error_type(KeyError()) == "KeyError"
    assert custom.message == "custom failure"
    assert len(long.message) == MAX_ERROR_MESSAGE
    assert long.message.endswith("...")
    assert cut.request == long_request[:SERVICE_ERROR_REQUEST_BYTES]
    assert member.errors == 3


def test_no_event_for_a_session_that_is_closing() -> None:
    member = Member()
    data, _ = records(term(), opened())
    member.container.apply(data, 0)
    member.container.sessions[SID].is_closing = True
    more, _ = records(message(b"boom"))
    member.container.apply(more, len(data))
    assert member.egress.errors() == []
    assert member.errors == 1


@pytest.mark.parametrize(
    "callback",
    [
        "on_session_open",
        "on_session_close",
        "on_timer_event",
        "on_new_leadership_term_event",
        "service message",
    ],
)
def test_every_callback_applied_from_the_log_is_caught(
    callback: str, caplog: pytest.LogCaptureFixture
) -> None:
    member = Member(service=Fragile(callback))
    data, _ = records(
        term(),
        opened(),
        message(b"a"),
        TimerEvent(TERM, 42, T + 5),
        message(b"from the service", sid=-1),  # a service message: session None
        SessionCloseEvent(TERM, SID, T + 6, CloseReason.CLIENT_ACTION),
        opened(2),
        message(b"c", sid=2),
    )
    with caplog.at_level(logging.ERROR, logger="cluster.service"):
        assert member.container.apply(data, 0) == len(data)
    assert member.errors == (2 if callback == "on_session_open" else 1)  # two opens
    assert member.container.log_position == len(data)
    assert member.egress.errors() == []  # only a client's message is answered with one
    seen = member.service.seen
    assert seen[-1] == b"c"  # the last entry was applied
    assert ("timer", 42) in seen
    assert ("close", SID) in seen
    assert SID not in member.container.sessions  # the close took effect all the same
    assert 2 in member.container.sessions  # and so did the open
    name = "on_session_message" if callback == "service message" else callback
    (record,) = caplog.records  # the second open's error is the same one: not logged again
    assert f"the service's {name} raised RuntimeError" in record.getMessage()
    assert record.exc_info is not None  # with its traceback


def test_on_role_change_and_on_terminate_are_caught() -> None:
    member = Member(service=Fragile("on_role_change", "on_terminate"))
    assert member.errors == 1  # the LEADER role change in the harness
    roles = [member.container.role]
    member.container.set_role(Role.FOLLOWER)
    roles.append(member.container.role)
    assert roles == [Role.LEADER, Role.FOLLOWER]  # set all the same
    assert member.errors == 2
    member.container.terminate()  # logged, not raised


class Quit(BaseException):
    """A service's own BaseException (not an Exception)."""


@pytest.mark.parametrize("path", ["apply", "mirror", "records"])
@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b"interrupt", "KeyboardInterrupt"),
        (b"exit", "SystemExit"),
        (b"genexit", "GeneratorExit"),
        (b"quit", "test_service_errors.Quit"),
    ],
)
def test_a_base_exception_a_callback_raises_is_a_service_error(
    payload: bytes, kind: str, path: str
) -> None:
    """A SystemExit or KeyboardInterrupt raised by the service's own code is in the log
    for good: let through, it would stop every member at every start (issue 41)."""
    member = Member()
    data, spans = records(term(), opened(), message(payload, at=1), message(b"b", at=2))
    if path == "records":
        assert member.container.apply_records(spans, 0) == len(data)
    else:
        assert member.container.apply(data, 0, mirror_into_consensus=path == "mirror") == len(data)
    assert member.errors == 1
    assert member.service.seen[-1] == b"b"  # the next entry was applied
    (event,) = member.egress.errors()
    assert event.error_type.endswith(kind)
    assert event.request == payload


def test_a_base_exception_in_any_callback_is_caught() -> None:
    class Exits(Fragile):
        def _maybe_raise(self, callback: str) -> None:
            if callback in self.raise_in:
                raise SystemExit(f"{callback} exits")

    member = Member(service=Exits("on_session_open", "on_timer_event", "on_role_change"))
    data, _ = records(term(), opened(), TimerEvent(TERM, 42, T + 5), message(b"a"))
    assert member.container.apply(data, 0) == len(data)
    assert member.service.seen[-1] == b"a"
    member.container.set_role(Role.FOLLOWER)
    assert member.container.role is Role.FOLLOWER
    assert member.errors == 4  # the harness's LEADER role change, open, timer, FOLLOWER


def test_a_base_exception_with_stop_stops_the_member_with_a_service_failure() -> None:
    member = Member(policy=STOP)
    data, _ = records(term(), opened(), message(b"exit"))
    with pytest.raises(ServiceFailure) as info:
        member.container.apply(data, 0)
    assert isinstance(info.value.error, SystemExit)


def test_on_start_or_on_take_snapshot_exiting_is_the_service_s_failure() -> None:
    class ExitsOnStart(Fragile):
        def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
            raise SystemExit(0)

    with pytest.raises(ServiceFailure):
        Member(service=ExitsOnStart())

    class ExitsOnSnapshot(Fragile):
        def on_take_snapshot(self) -> bytes:
            raise KeyboardInterrupt

    with pytest.raises(ServiceStateError):
        take_service_snapshot(ExitsOnSnapshot())


def test_the_same_error_is_logged_with_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    member = Member()
    payloads = [b"boom 1", b"boom 22", b"boom 333", b"custom"]
    data, _ = records(term(), opened(), *(message(p) for p in payloads))
    with caplog.at_level(logging.ERROR, logger="cluster.service"):
        position = member.container.apply(data, 0)
        # the same error (numbers masked) again, ten seconds on: one line, no traceback
        member.now += REPEAT_LOG_INTERVAL_NS
        more, _ = records(message(b"boom 4444"))
        member.container.apply(more, position)
    assert member.errors == 5
    lines = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert len(lines) == 3, lines
    assert "raised ValueError: bad payload b'boom 1'" in lines[0][0]
    assert lines[0][1]
    assert "the member goes on (--on-service-error continue)" in lines[0][0]
    assert f"raised {__name__}.CustomError: custom failure" in lines[1][0]
    assert lines[1][1]
    assert "bad payload b'boom 4444'" in lines[2][0]
    assert "again (3 times since the last report, 4 in all)" in lines[2][0]
    assert not lines[2][1]


# ---------------------------------------------------------------------- stop


def test_stop_raises_a_service_failure(caplog: pytest.LogCaptureFixture) -> None:
    member = Member(policy="stop")
    data, _ = records(*GOOD_AND_BAD)
    with caplog.at_level(logging.ERROR, logger="cluster.service"):
        with pytest.raises(ServiceFailure) as info:
            member.container.apply(data, 0)
    failure = info.value
    assert failure.callback == "on_session_message"
    assert failure.log_position == boom_end()
    assert isinstance(failure.error, ValueError)
    assert failure.__cause__ is failure.error
    assert str(failure) == (
        "the service's on_session_message raised ValueError: bad payload b'boom' at log "
        f"position {boom_end()}"
    )
    assert member.errors == 1
    assert member.service.seen[-1] == b"a"  # nothing after it was applied
    assert member.egress.errors() == []
    (record,) = caplog.records
    assert "stopping this member (--on-service-error stop)" in record.getMessage()
    assert f"at log position {boom_end()}" in record.getMessage()
    assert record.exc_info is not None


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_on_start_raising_always_stops(policy: str) -> None:
    with pytest.raises(ServiceFailure) as info:
        Member(policy=policy, service=Fragile("on_start"))
    assert info.value.callback == "on_start"
    assert "RuntimeError: on_start failed on purpose" in str(info.value)


def test_a_memory_error_stops_even_with_continue() -> None:
    member = Member()
    data, _ = records(term(), opened(), message(b"memory"))
    with pytest.raises(ServiceFailure) as info:
        member.container.apply(data, 0)
    assert isinstance(info.value.error, MemoryError)


# ---------------------------------------------------------------------- configuration


def test_the_policy_is_a_setting() -> None:
    assert load_config([], {}).on_service_error == "continue"
    assert load_config(["--on-service-error", "stop"], {}).on_service_error == "stop"
    assert load_config([], {"CLUSTER_ON_SERVICE_ERROR": "Stop"}).on_service_error == "stop"
    with pytest.raises(ConfigError, match=r"on-service-error.*not one of continue, stop"):
        load_config(["--on-service-error", "contineu"], {})
    with pytest.raises(ValueError, match="one of continue, stop"):
        ServiceErrorPolicy("ignore")


def test_the_counter_is_exported() -> None:
    status = MemberStatus(member_id=2, counters={"service_errors": 3, "snapshot_failures": 1})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    assert 'triarch_service_errors_total{member="2"} 3.0' in text
    assert 'triarch_snapshot_failures_total{member="2"} 1.0' in text


# ---------------------------------------------------------------------- the exit code


@pytest.mark.parametrize("how", ["plain", "group", "group with another error"])
def test_the_node_command_exits_1_on_a_service_failure(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``Node.run`` raises the failure itself; from a task (a snapshot installed from the
    leader, whose ``on_start`` raised) it comes in the nursery's ExceptionGroup."""
    failure = ServiceFailure("on_start", 42, RuntimeError("cannot load"))
    raised: dict[str, BaseException] = {
        "plain": failure,
        "group": ExceptionGroup("agents", [ExceptionGroup("catch-up", [failure])]),
        "group with another error": ExceptionGroup("agents", [failure, OSError("eh")]),
    }

    class FailingNode:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        async def run(self, **kwargs: Any) -> None:
            raise raised[how]

    monkeypatch.setattr(launch, "Node", FailingNode)
    installed = errorlog.installed()
    try:
        with caplog.at_level(logging.ERROR, logger="cluster.node"):
            code = launch.main(["--dir", str(tmp_path), "--members", "0=127.0.0.1:1:2:3"])
    finally:
        if installed is None:
            errorlog.uninstall()  # main() installs the process's error log
    assert code == 1
    unexpected = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert len(unexpected) == (1 if how == "group with another error" else 0)

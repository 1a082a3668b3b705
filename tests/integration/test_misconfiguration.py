"""Misconfiguration is loud (issue 31): member links between members whose ``--members``
(other member ids) or ``--cluster-id`` differ log an ERROR on both ends (lists whose
addresses alone differ, a ``--members`` change rolling out, only an INFO: issue 41); a
member that cannot reach its peers WARNs every interval naming each one and why; a port
already in use is one line naming it.  Real sockets on loopback, member links
(:class:`PeerLinks`) in this process."""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio

from cluster.agents.consensus import PeerLinks
from cluster.certs import make_certs
from cluster.config import NodeConfig, members_digest, parse_members
from cluster.errorlog import DistinctErrorLog
from cluster.examples.kv import KeyValueService
from cluster.local import free_ports
from cluster.node import Node
from cluster.protocol.consensus import CommitPosition, ConsensusMessage
from cluster.transport.base import ListenError, listen_error_in
from cluster.transport.tcp import TcpNetwork
from cluster.transport.tls import load_identity

HOST = "127.0.0.1"
WAIT = 30.0
"""Seconds to wait for what a busy two-core machine does in milliseconds."""


class Records(logging.Handler):
    """Every record of the ``cluster`` loggers while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]

    async def wait(self, level: int, *parts: str) -> str:
        """The first message at ``level`` holding every one of ``parts``, once logged."""
        with trio.fail_after(WAIT):
            while True:
                for text in self.at(level):
                    if all(part in text for part in parts):
                        return text
                await trio.sleep(0.01)


@contextmanager
def logged() -> Iterator[tuple[Records, DistinctErrorLog]]:
    """What is logged, and what ``cluster-tool errors`` would show of it."""
    logger = logging.getLogger("cluster")
    records, errors = Records(), DistinctErrorLog()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(records)
    logger.addHandler(errors)
    try:
        yield records, errors
    finally:
        logger.removeHandler(records)
        logger.removeHandler(errors)
        logger.setLevel(level)


def members_text(ports: list[int], count: int) -> str:
    return ",".join(
        f"{i}={HOST}:{ports[3 * i]}:{ports[3 * i + 1]}:{ports[3 * i + 2]}" for i in range(count)
    )


class Member:
    """One member's links, as a node makes them, and what they deliver."""

    def __init__(
        self,
        members: str,
        member_id: int,
        *,
        cluster_id: int = 0,
        digest: bool = True,
        interval: float = 10.0,
        network: TcpNetwork | None = None,
    ) -> None:
        listed = parse_members(members)
        self.delivered: list[ConsensusMessage] = []
        self.links = PeerLinks(
            network or TcpNetwork(),
            next(m for m in listed if m.member_id == member_id),
            [m for m in listed if m.member_id != member_id],
            self.delivered.append,
            max_frame_size=1 << 20,
            cluster_id=cluster_id,
            hello_timeout=WAIT,
            members_digest=members_digest(listed) if digest else b"",
            unreachable_warning_interval=interval,
        )


@asynccontextmanager
async def running(*members: Member) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for member in members:
            await nursery.start(member.links.run)
        yield
        nursery.cancel_scope.cancel()


async def wait_for(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


# ---------------------------------------------------------------------- member lists


async def test_lists_with_another_address_are_noted_on_both_ends_and_the_link_goes_on() -> None:
    """A rolling ``--members`` change of member 1's address: member 0 has the new list,
    member 1 the old one.  Both log it at INFO naming the other and the entry that
    differs (a documented change is routine: nothing in ``cluster-tool errors``); the
    links stay up (the quorum is not lost half-way through the change)."""
    ports = free_ports(7)
    ours = members_text(ports, 2)
    theirs = ours.replace(f":{ports[5]}", f":{ports[6]}")  # member 1's admin port
    zero, one = Member(ours, 0), Member(theirs, 1)
    with logged() as (records, errors):
        async with running(zero, one):
            at_zero = await records.wait(
                logging.INFO,
                "member 1's --members differs from ours: the same member ids, but its "
                f"entries for member 1 differ from ours (1={HOST}:{ports[3]}:{ports[4]}:"
                f"{ports[5]})",
                "the link goes on",
            )
            at_one = await records.wait(
                logging.INFO,
                "member 0's --members differs from ours: the same member ids, but its "
                f"entries for member 1 differ from ours (1={HOST}:{ports[3]}:{ports[4]}:"
                f"{ports[6]})",
            )
            assert "every member needs the same list" in at_zero
            assert "every member needs the same list" in at_one
            # the links are up and carry messages both ways
            await wait_for(lambda: zero.links.inbound.get(1) == 1 == one.links.inbound.get(0))
            await wait_for(
                lambda: zero.links.links[1].is_connected and one.links.links[0].is_connected
            )
            zero.links.send(1, CommitPosition(1, 0, 0))
            one.links.send(0, CommitPosition(1, 0, 1))
            zero.links.flush()
            one.links.flush()
            await wait_for(lambda: bool(zero.delivered and one.delivered))
            assert zero.links.links[1].connects == 1 == one.links.links[0].connects
    # `cluster-tool errors` shows nothing of it: WARNING and ERROR are for what an
    # operator must act on, and this is a change under way
    assert [e.message for e in errors.entries() if "--members" in e.message] == []


async def test_lists_naming_other_members_refuse_the_link_with_an_error_on_both_ends() -> None:
    ports = free_ports(9)
    two, three = members_text(ports, 2), members_text(ports, 3)
    zero, one = Member(two, 0), Member(three, 1)
    with logged() as (records, _):
        async with running(zero, one):
            # member 0 refuses member 1's hello, and member 1 reads why
            await records.wait(
                logging.ERROR,
                "closing member link: member 1's --members differs from ours: other member "
                "ids (it lists 3 members, we list 2: ",
                "its link is refused",
            )
            await records.wait(
                logging.ERROR,
                "member 0's --members differs from ours: other member ids (it lists 2 "
                "members, we list 3: ",
                "our entries for member 2 are not in its list; it refuses the link",
            )
            # and the other way round
            await records.wait(
                logging.ERROR, "closing member link: member 0's --members differs from ours"
            )
            await records.wait(logging.ERROR, "member 1's --members differs from ours: other")
            await wait_for(
                lambda: (
                    zero.links.links[1].last_error.startswith("hello refused: its --members")
                    and one.links.links[0].last_error.startswith("hello refused: its --members")
                )
            )
            assert zero.links.inbound == {} == one.links.inbound


async def test_another_cluster_id_is_an_error_on_both_ends() -> None:
    ports = free_ports(6)
    members = members_text(ports, 2)
    zero, one = Member(members, 0, cluster_id=7), Member(members, 1, cluster_id=8)
    with logged() as (records, _):
        async with running(zero, one):
            await records.wait(
                logging.ERROR,
                "member link hello from member 1 of cluster 8, this is cluster 7 "
                "(--cluster-id differs)",
            )
            await records.wait(
                logging.ERROR,
                f"member link to member 0 at {HOST}:{ports[1]} refused: it is a member of "
                "cluster 7, this member of cluster 8 (--cluster-id differs)",
            )
            await wait_for(
                lambda: one.links.links[0].last_error == "hello refused: it is of cluster 7, not 8"
            )


async def test_a_member_that_sends_no_digest_is_not_refused() -> None:
    """An older member (or the simulator) says nothing of its list: nothing to compare."""
    ports = free_ports(7)
    ours = members_text(ports, 2)
    zero, one = (
        Member(ours, 0),
        Member(ours.replace(f":{ports[5]}", f":{ports[6]}"), 1, digest=False),
    )
    with logged() as (records, _):
        async with running(zero, one):
            await wait_for(lambda: zero.links.inbound.get(1) == 1 == one.links.inbound.get(0))
            await wait_for(
                lambda: zero.links.links[1].is_connected and one.links.links[0].is_connected
            )
    assert records.at(logging.ERROR) == []


# ---------------------------------------------------------------------- unreachable peers


async def test_unreachable_peers_are_named_with_why_every_interval() -> None:
    ports = free_ports(9)  # members 1 and 2 never start: their ports refuse
    zero = Member(members_text(ports, 3), 0, interval=0.2)
    with logged() as (records, _):
        async with running(zero):
            first = await records.wait(  # once both have been dialled
                logging.WARNING, "cannot reach member 1 at", "refused), member 2", "refused);"
            )
            await wait_for(
                lambda: len([m for m in records.at(logging.WARNING) if "cannot reach" in m]) >= 2
            )
    assert first == (
        f"cannot reach member 1 at {HOST}:{ports[4]} (cannot connect to {HOST}:{ports[4]}: "
        f"connection refused), member 2 at {HOST}:{ports[7]} (cannot connect to "
        f"{HOST}:{ports[7]}: connection refused); 1 of 3 members reachable (with this one), "
        "no quorum (2 needed)"
    )


async def test_a_reachable_peer_is_not_named_and_a_quorum_is_said(tmp_path: Path) -> None:
    ports = free_ports(9)
    members = members_text(ports, 3)
    zero, one = Member(members, 0, interval=0.2), Member(members, 1, interval=3600)
    with logged() as (records, _):
        async with running(zero, one):
            await wait_for(lambda: zero.links.links[1].is_connected)
            text = await records.wait(logging.WARNING, "cannot reach", "refused", "a quorum")
    assert "member 1" not in text
    assert text.startswith(f"cannot reach member 2 at {HOST}:{ports[7]} (")
    assert text.endswith("; 2 of 3 members reachable (with this one), a quorum")


async def test_a_peer_with_another_cas_certificate_is_named_with_the_tls_reason(
    tmp_path: Path,
) -> None:
    ours, other = tmp_path / "ours", tmp_path / "other"
    make_certs(ours, [(0, HOST), (1, HOST)])
    make_certs(other, [(0, HOST), (1, HOST)])
    ports = free_ports(6)
    members = members_text(ports, 2)
    zero = Member(
        members, 0, interval=0.2, network=TcpNetwork(tls=load_identity(ours / "member-0"))
    )
    one = Member(
        members, 1, interval=3600, network=TcpNetwork(tls=load_identity(other / "member-1"))
    )
    with logged() as (records, _):
        async with running(zero, one):
            text = await records.wait(
                logging.WARNING, "cannot reach member 1 at", "certificate refused"
            )
    # OpenSSL says "self-signed certificate in certificate chain" or "unable to get local
    # issuer certificate", as its version has it
    assert f"(TLS handshake with {HOST}:{ports[4]} failed: certificate refused (" in text
    assert ": not signed by our CA)); 1 of 2 members reachable" in text


async def test_a_wrong_members_certificate_is_named(tmp_path: Path) -> None:
    """Member 1's address serves member 0's certificate (two members' folders mixed)."""
    make_certs(tmp_path, [(0, HOST), (1, HOST)])
    ports = free_ports(6)
    members = members_text(ports, 2)
    zero = Member(
        members, 0, interval=0.2, network=TcpNetwork(tls=load_identity(tmp_path / "member-0"))
    )
    impostor = Member(
        members, 1, interval=3600, network=TcpNetwork(tls=load_identity(tmp_path / "member-0"))
    )
    with logged() as (records, _):
        async with running(zero, impostor):
            text = await records.wait(logging.WARNING, "cannot reach member 1 at", "wrong")
    assert "(wrong member: certificate 'member-0' (member) is not member 1's)" in text


# ---------------------------------------------------------------------- ports in use


@contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


async def handler(stream: trio.abc.Stream) -> None:
    await stream.aclose()


async def test_a_port_in_use_is_a_listen_error_naming_it() -> None:
    with taken_port() as port:
        with pytest.raises(ListenError) as caught:
            await TcpNetwork().serve(HOST, port, handler)
    assert str(caught.value) == f"cannot listen on {HOST}:{port} (address already in use)"
    assert caught.value.errno == errno.EADDRINUSE
    assert (caught.value.host, caught.value.port) == (HOST, port)
    assert isinstance(caught.value, OSError)


def test_listen_errors_say_why_in_words() -> None:
    from cluster.transport.base import listen_error

    for code, words in (
        (errno.EADDRNOTAVAIL, "no such address on this machine"),
        (errno.EACCES, "permission denied"),
    ):
        error = listen_error(HOST, 80, OSError(code, "whatever the OS says"))
        assert str(error) == f"cannot listen on {HOST}:80 ({words})"
        assert error.errno == code
    unresolved = listen_error("no-such-host", 1, socket.gaierror(-2, "Name or service not known"))
    assert str(unresolved) == (
        "cannot listen on no-such-host:1 (cannot resolve 'no-such-host': Name or service not known)"
    )
    assert str(listen_error("::1", 9, OSError(errno.EADDRINUSE, "x"))) == (
        "cannot listen on [::1]:9 (address already in use)"
    )


async def test_a_member_links_port_in_use_is_found_in_the_nurserys_exception_group() -> None:
    ports = free_ports(6)
    with taken_port() as port:
        ports[1] = port
        zero = Member(members_text(ports, 2), 0)
        with pytest.raises(BaseExceptionGroup) as caught:
            async with running(zero):
                pass
    found = listen_error_in(caught.value)
    assert found is not None
    assert str(found) == f"cannot listen on {HOST}:{port} (address already in use)"
    assert listen_error_in(ValueError("no")) is None


async def test_a_nodes_port_in_use_is_a_listen_error_naming_it(tmp_path: Path) -> None:
    with taken_port() as port:
        consensus, admin = free_ports(2)
        config = NodeConfig(members=f"0={HOST}:{port}:{consensus}:{admin}", dir=str(tmp_path))
        node = Node(config, KeyValueService())
        with pytest.raises(BaseException) as caught:  # noqa: PT011 (a group, whatever its shape)
            with trio.fail_after(WAIT):
                await node.run(handle_signals=False)
    found = listen_error_in(caught.value)
    assert found is not None, caught.value
    assert str(found) == f"cannot listen on {HOST}:{port} (address already in use)"


# ---------------------------------------------------------------------- as an operator


def node_process(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m cluster.node ARGS`` to its end (it fails at start-up, or this fails)."""
    return subprocess.run(
        [sys.executable, "-m", "cluster.node", "--dir", str(tmp_path / "data"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("members", "message"),
    [
        (
            "0={h}:{p}:{q}:{r};1={h}:{s}:{t}:{u}",
            "error: bad --members: bad member '0={h}:{p}:{q}:{r};1={h}:{s}:{t}:{u}': more than "
            "one member in one entry (separate members with ',', not ';')",
        ),
        (
            "0=127.0.0.l:{p}:{q}:{r}",
            "error: bad --members: bad member '0=127.0.0.l:{p}:{q}:{r}': host '127.0.0.l' is not "
            "an IP address (an IPv4 address is four numbers 0-255 separated by dots: a typo?)",
        ),
        (
            "0={h}:{p}:{p}:{r}",
            "error: bad --members: bad member '0={h}:{p}:{p}:{r}': its ingress and consensus "
            "ports are both {p} (each needs a port of its own)",
        ),
    ],
)
def test_a_node_refuses_members_typos_with_exit_code_2(
    tmp_path: Path, members: str, message: str
) -> None:
    p, q, r, s, t, u = free_ports(6)
    fill = {"h": HOST, "p": p, "q": q, "r": r, "s": s, "t": t, "u": u}
    done = node_process(tmp_path, "--members", members.format(**fill))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == message.format(**fill)
    assert "loopback" not in done.stderr


@pytest.mark.slow
def test_a_node_on_a_port_in_use_exits_2_naming_it(tmp_path: Path) -> None:
    consensus, admin = free_ports(2)
    with taken_port() as port:
        done = node_process(tmp_path, "--members", f"0={HOST}:{port}:{consensus}:{admin}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot listen on {HOST}:{port} (address already in use)"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_metrics_port_in_use_exits_2_naming_it(tmp_path: Path) -> None:
    ingress, consensus, admin = free_ports(3)
    with taken_port() as port:
        done = node_process(
            tmp_path,
            "--members",
            f"0={HOST}:{ingress}:{consensus}:{admin}",
            "--metrics-port",
            str(port),
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot listen on {HOST}:{port} (address already in use)"
    )
    assert "Traceback" not in done.stderr


def test_a_failed_connect_says_why_in_words() -> None:
    """Trio's "all attempts to connect to HOST:PORT failed" hides the reason in its
    context; a member's WARNING names it (and the errno stays)."""
    from cluster.transport.tcp import _connect_error

    def failed(*codes: int) -> OSError:
        error = OSError(f"all attempts to connect to {HOST}:9 failed")
        error.__context__ = ExceptionGroup("attempts", [OSError(c, os.strerror(c)) for c in codes])
        return error

    unreachable = _connect_error(failed(errno.EHOSTUNREACH), HOST, 9)
    assert unreachable.strerror == f"cannot connect to {HOST}:9: no route to host"
    assert unreachable.errno == errno.EHOSTUNREACH
    refused = _connect_error(failed(errno.ENETUNREACH, errno.ECONNREFUSED), HOST, 9)
    assert isinstance(refused, ConnectionRefusedError)
    assert refused.strerror == f"cannot connect to {HOST}:9: connection refused"
    other = _connect_error(failed(errno.EPERM), HOST, 9)
    assert other.strerror == f"cannot connect to {HOST}:9: {os.strerror(errno.EPERM)}"
    unresolved = _connect_error(socket.gaierror(-2, "Name or service not known"), "nohost", 9)
    assert unresolved.strerror == "cannot resolve 'nohost' (Name or service not known)"

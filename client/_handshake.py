"""The anyio shell around :class:`~client._connect.AsyncConnect`: dial members, run it.

While the session is not open, four kinds of event reach the handshake from other
tasks, and wait in one queue for the task running :meth:`~Handshake.drive`::

    ("egress", message)     a message on any egress connection (the egress readers)
    ("connected", ingress)  a connector task reached a member
    ("lost", ingress)       an ingress connection broke or was dropped (the writer)
    ("tls", (id, endpoint)) a member that closed our plaintext request answers a TLS hello

``drive`` feeds them to the state machine and carries out its actions: start connector
tasks (one per member, every member at once, retrying those that refuse), send the
connect request or challenge response, and stop at ``Done`` or raise at ``Fail``.  It
also gives the machine its clock: when the member the request went to has not answered
within :data:`~client._connect.ANSWER_TIMEOUT` (a paused process still completes TCP
connections), the machine asks the other members too (``ConnectEach``), and the shell
then holds one connection per member asked, each with its own request; the first OK
wins and every other connection is closed (``DropIngress`` ends one sooner).  Whatever
is still queued when the session opens is the shell's to take
(:meth:`~Handshake.take_leftovers`).

Redials back off (:func:`~client._ingress.backoff_delay`): a connector waits before each
retry of a member that refused, and losing the handshake's connection (a port that
accepts and closes at once, a member that breaks it mid-handshake) counts as a failure
that the next round of connectors carries on from, waiting before its first dial.  The
count lasts for the whole handshake; with no failure yet (a fresh connect, a redirect to
the leader) the connectors dial at once.

A member that closes our plaintext connect request without a word may want TLS: each
member is then asked once (:meth:`~Handshake.probe_tls`), and when every member dialled
speaks TLS the handshake ends at once with :class:`~client.errors.TlsRequiredError` (no
``certs_dir``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from cluster.protocol import encode_frame
from cluster.transport.tls import speaks_tls, tls_required

from ._connect import (
    AsyncConnect,
    ConnectEach,
    ConnectIngress,
    Done,
    DropIngress,
    Fail,
    SendMessage,
)
from ._dial import NETWORK_ERRORS, TLS_REQUIRED_WORDS, aclose_quietly, try_connect
from ._endpoints import Endpoint
from ._ingress import Ingress, IngressWriter, backoff_delay
from ._session import Session
from ._sync import Backend, Broadcast
from .errors import TlsRequiredError

__all__ = ["Handshake"]

_CLOSED_PLAIN = (
    "closed the connection without answering (is it a member's ingress port? the admin "
    "and consensus ports speak another protocol)"
)
_CLOSED_TLS = (
    "closed the TLS connection without answering (a member refuses a certificate that "
    "way: is certs_dir a client-NAME folder of this cluster's `cluster-tool certs`? Or "
    "is it a member's admin or consensus port?)"
)


class Handshake:
    """Runs one connect handshake over real connections (see the module docstring).

    ``spawn`` starts a task in the client's task group; ``max_events`` bounds the egress
    messages queued before the session opens (as ``max_egress_backlog`` does after).
    """

    def __init__(
        self,
        session: Session,
        writer: IngressWriter,
        backend: Backend,
        spawn: Callable[..., None],
        *,
        max_events: int,
    ) -> None:
        self._session = session
        self._writer = writer
        self._spawn = spawn
        self._max_events = max_events
        self._events: deque[tuple[str, Any]] = deque()
        self.changed = Broadcast(backend)
        # member id -> (scope, endpoint) of the connector dialling it
        self._connectors: dict[int, tuple[anyio.CancelScope, Endpoint]] = {}
        # handshake connections lost so far (each round of connectors backs off for them)
        self.failures = 0
        self.reached_any = False  # some member accepted a connection
        # members asked whether they speak TLS (a plaintext client turned away), and who does
        self._probed: set[Endpoint] = set()
        self.tls_required: dict[int, Endpoint] = {}

    def on_egress(self, message: Any) -> None:
        """An egress message before the session opened: queue it (while there is room)."""
        if self._session.close_reason is None and len(self._events) < self._max_events:
            self._events.append(("egress", message))
            self.changed.notify()

    def on_lost(self, ingress: Ingress) -> None:
        """An ingress connection broke or was dropped before the session opened."""
        self._events.append(("lost", ingress))
        self.changed.notify()

    def take_leftovers(self) -> list[tuple[str, Any]]:
        """The events still queued, oldest first; the queue is left empty."""
        leftovers = list(self._events)
        self._events.clear()
        return leftovers

    # ------------------------------------------------------------------ connectors

    def start_connectors(self, members: Mapping[int, Endpoint]) -> None:
        """Dial ``members`` (after the back-off that :attr:`failures` calls for), and no
        one else: connectors to other members stop."""
        self.stop_connectors()
        self.add_connectors(members)

    def add_connectors(self, members: Mapping[int, Endpoint]) -> None:
        """Dial ``members`` too, each unless a connector to it runs already."""
        for member_id, endpoint in members.items():
            running = self._connectors.get(member_id)
            if running is not None and running[1] == endpoint:
                continue
            if running is not None:
                running[0].cancel()
            scope = anyio.CancelScope()
            self._connectors[member_id] = (scope, endpoint)
            self._spawn(self._connector, member_id, endpoint, scope, self.failures)

    def keep_connectors(self, members: Mapping[int, Endpoint]) -> None:
        """Stop the connectors to anyone but ``members``."""
        for member_id in [m for m in self._connectors if m not in members]:
            self._connectors.pop(member_id)[0].cancel()

    def stop_connectors(self) -> None:
        for scope, _ in self._connectors.values():
            scope.cancel()
        self._connectors.clear()

    async def _connector(
        self, member_id: int, endpoint: Endpoint, scope: anyio.CancelScope, failures: int
    ) -> None:
        """Dial one member until it answers (members that refuse are retried); cancelled
        by ``scope`` once no connection to it is wanted.

        ``failures`` earlier failures in a row call for a back-off before the first dial
        (none when it is 0); each refusal adds one."""
        with scope:
            try:
                attempt = failures
                while True:
                    if attempt > 0:
                        await anyio.sleep(backoff_delay(attempt))
                    stream = await try_connect(endpoint, self._writer.tls)
                    if not isinstance(stream, str):
                        break
                    self._writer.failures[endpoint] = stream
                    attempt += 1
            finally:
                if self._connectors.get(member_id, (None,))[0] is scope:
                    del self._connectors[member_id]
            session = self._session
            if scope.cancel_called or session.open or session.close_reason is not None:
                await aclose_quietly(stream)
                return
            self.reached_any = True
            self._events.append(
                ("connected", self._writer.new_ingress(member_id, endpoint, stream))
            )
            self.changed.notify()

    # ------------------------------------------------------------------ TLS

    def probe_tls(self, members: Mapping[int, Endpoint]) -> None:
        """A plaintext connection was closed without an answer: ask each of ``members``
        not asked yet whether it speaks TLS (one TLS hello each, at once, in a task of
        its own); each that does is queued as a ``("tls", (member_id, endpoint))`` event."""
        if self._writer.tls is not None:
            return
        todo = {m: e for m, e in members.items() if e not in self._probed}
        if todo:
            self._probed.update(todo.values())
            self._spawn(self._probe, todo)

    async def _probe(self, members: dict[int, Endpoint]) -> None:
        async def one(member_id: int, endpoint: Endpoint) -> None:
            if await speaks_tls(endpoint.host, endpoint.port):
                self._writer.failures[endpoint] = TLS_REQUIRED_WORDS
                self._events.append(("tls", (member_id, endpoint)))
                self.changed.notify()

        async with anyio.create_task_group() as tg:
            for member_id, endpoint in members.items():
                tg.start_soon(one, member_id, endpoint)

    # ------------------------------------------------------------------ the handshake

    async def drive(self, machine: AsyncConnect, response_channel: str) -> tuple[Done, Ingress]:
        """Run ``machine`` until the session is granted: return ``Done`` and the ingress
        that carried the handshake (it may have broken since; every other one is
        dropped).  Raises the error of a ``Fail``.  The caller stops the connectors,
        whatever the outcome."""
        writer = self._writer
        actions = deque(machine.on_egress_bound(response_channel))
        held: dict[int, Ingress] = {}  # member id -> the connection its request is on
        while True:
            while actions:
                action = actions.popleft()
                if isinstance(action, ConnectIngress):
                    for ingress in held.values():
                        writer.drop(ingress)
                    held.clear()
                    self.start_connectors(action.members)
                elif isinstance(action, ConnectEach):
                    self.add_connectors(action.members)
                elif isinstance(action, DropIngress):
                    if action.member_id in held:
                        writer.drop(held.pop(action.member_id))
                elif isinstance(action, SendMessage):
                    chosen = held[action.member_id]  # the machine asks only members held
                    try:
                        await chosen.stream.send(encode_frame(action.message))
                    except NETWORK_ERRORS:
                        writer.drop(chosen)  # queues a "lost" event
                    else:
                        actions.extend(machine.on_sent(action.member_id))
                elif isinstance(action, Done):
                    chosen = held.pop(action.result.member_id)
                    for ingress in held.values():  # the other members asked
                        writer.drop(ingress)
                    return action, chosen
                elif isinstance(action, Fail):
                    raise action.error
            self.keep_connectors(machine.dialling)
            if not self._events:
                deadline = machine.deadline
                with anyio.CancelScope(deadline=math.inf if deadline is None else deadline):
                    while not self._events:
                        await self.changed.wait()
                if not self._events:  # the deadline came first
                    actions.extend(machine.on_timer())
                    continue
            kind, item = self._events.popleft()
            if kind == "egress":
                actions.extend(machine.on_egress_message(item))
            elif kind == "connected":
                new = machine.on_ingress_connected(item.member_id)
                if new:
                    if item.member_id in held:  # (cannot be: one attempt per member)
                        writer.drop(held.pop(item.member_id))
                    held[item.member_id] = item
                    writer.install(item)
                    actions.extend(new)
                else:
                    await writer.close_ingress(item)
            elif kind == "lost":
                lost: Ingress = item
                if held.get(lost.member_id) is not lost:
                    continue  # dropped here already: its attempt is over
                # a failure, however soon it broke: the next connectors back off first
                self.failures += 1
                if not lost.received and lost.endpoint not in self.tls_required.values():
                    writer.failures[lost.endpoint] = (
                        _CLOSED_TLS if writer.tls is not None else _CLOSED_PLAIN
                    )
                    self.probe_tls(machine.targets)
                del held[lost.member_id]
                actions.extend(machine.on_ingress_lost(lost.member_id))
            elif kind == "tls":
                member_id, endpoint = item
                self.tls_required[member_id] = endpoint
                targets = machine.targets
                if targets and set(targets) <= set(self.tls_required):
                    ids = sorted(targets)
                    raise TlsRequiredError(tls_required(ids, "certs_dir"), ids)

"""The anyio shell around :class:`~client._connect.AsyncConnect`: dial members, run it.

While the session is not open, four kinds of event reach the handshake from other
tasks, and wait in one queue for the task running :meth:`~Handshake.drive`::

    ("egress", message)     a message on any egress connection (the egress readers)
    ("connected", ingress)  a connector task reached a member
    ("lost", ingress)       an ingress connection broke or was dropped (the writer)
    ("tls", (id, endpoint)) a member that closed our plaintext request answers a TLS hello

``drive`` feeds them to the state machine and carries out its actions: start connector
tasks (every member at once, retrying those that refuse), send the connect request or
challenge response, and stop at ``Done`` or raise at ``Fail``.  Whatever is still queued
when the session opens is the shell's to take (:meth:`~Handshake.take_leftovers`).

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

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from cluster.protocol import encode_frame
from cluster.transport.tls import speaks_tls, tls_required

from ._connect import AsyncConnect, ConnectIngress, Done, Fail, SendMessage
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
        self._connector_scope: anyio.CancelScope | None = None
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
        """Dial ``members`` (after the back-off that :attr:`failures` calls for)."""
        self.stop_connectors()
        scope = anyio.CancelScope()
        self._connector_scope = scope
        self._spawn(self._connect_members, dict(members), scope, self.failures)

    def stop_connectors(self) -> None:
        if self._connector_scope is not None:
            self._connector_scope.cancel()
            self._connector_scope = None

    async def _connect_members(
        self, members: dict[int, Endpoint], scope: anyio.CancelScope, failures: int
    ) -> None:
        """Dial every member at once; cancelled by ``scope`` once one is chosen."""
        with scope:
            async with anyio.create_task_group() as tg:
                for member_id, endpoint in members.items():
                    tg.start_soon(self._connector, member_id, endpoint, scope, failures)

    async def _connector(
        self, member_id: int, endpoint: Endpoint, scope: anyio.CancelScope, failures: int
    ) -> None:
        """Dial one member until it answers (members that refuse are retried).

        ``failures`` earlier failures in a row call for a back-off before the first dial
        (none when it is 0); each refusal adds one."""
        attempt = failures
        while True:
            if attempt > 0:
                await anyio.sleep(backoff_delay(attempt))
            stream = await try_connect(endpoint, self._writer.tls)
            if not isinstance(stream, str):
                break
            self._writer.failures[endpoint] = stream
            attempt += 1
        session = self._session
        if scope.cancel_called or session.open or session.close_reason is not None:
            await aclose_quietly(stream)
            return
        self.reached_any = True
        self._events.append(("connected", self._writer.new_ingress(member_id, endpoint, stream)))
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
        that carried the handshake (it may have broken since).  Raises the error of a
        ``Fail``.  The caller stops the connectors, whatever the outcome."""
        writer = self._writer
        actions = deque(machine.on_egress_bound(response_channel))
        chosen: Ingress | None = None
        while True:
            while actions:
                action = actions.popleft()
                if isinstance(action, ConnectIngress):
                    if chosen is not None:
                        writer.drop(chosen)
                        chosen = None
                    self.start_connectors(action.members)
                elif isinstance(action, SendMessage):
                    assert chosen is not None
                    assert chosen.member_id == action.member_id
                    try:
                        await chosen.stream.send(encode_frame(action.message))
                    except NETWORK_ERRORS:
                        writer.drop(chosen)  # queues a "lost" event
                    else:
                        actions.extend(machine.on_sent())
                elif isinstance(action, Done):
                    assert chosen is not None
                    return action, chosen
                elif isinstance(action, Fail):
                    raise action.error
            while not self._events:
                await self.changed.wait()
            kind, item = self._events.popleft()
            if kind == "egress":
                actions.extend(machine.on_egress_message(item))
            elif kind == "connected":
                new = machine.on_ingress_connected(item.member_id)
                if new:
                    chosen = item
                    self.stop_connectors()
                    writer.install(item)
                    actions.extend(new)
                else:
                    await writer.close_ingress(item)
            elif kind == "lost" and chosen is not None and item is chosen:
                # a failure, however soon it broke: the next connectors back off first
                self.failures += 1
                if not item.received and item.endpoint not in self.tls_required.values():
                    writer.failures[item.endpoint] = (
                        _CLOSED_TLS if writer.tls is not None else _CLOSED_PLAIN
                    )
                    self.probe_tls(machine.targets)
                actions.extend(machine.on_ingress_lost(chosen.member_id))
                chosen = None
            elif kind == "tls":
                member_id, endpoint = item
                self.tls_required[member_id] = endpoint
                targets = machine.targets
                if targets and set(targets) <= set(self.tls_required):
                    ids = sorted(targets)
                    raise TlsRequiredError(tls_required(ids, "certs_dir"), ids)

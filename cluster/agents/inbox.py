"""The inbox of the consensus duty cycle: member messages, and client messages taken
fairly, only as fast as the log can carry them.

Member-link readers append their messages to :attr:`IngressInbox.messages`; each
duty cycle takes them all.  Each client connection has a :class:`SourceQueue`: what
its reader decoded, in chunks (one per receive) of known size on the wire.  A duty cycle
takes from the connections with messages waiting in turn, at most
:attr:`~IngressInbox.quantum` bytes from each (deficit round-robin: what a connection
could not use carries over while it has more waiting), so a flooding client's messages
sit in its own queue while another's go straight through.  A connection with more
than ``max_backlog`` bytes waiting is not read (TCP pushes back on its client); nor is
any connection while all of them hold more than ``max_queued`` together.

Back-pressure from the log: while :attr:`IngressInbox.gate` says no (the leader holds
more log than it may not yet both durable and applied: a slow or full disk, slow
followers, a slow service), no client message is taken at all; the queues fill, their
readers stop, and the node's memory stays bounded.

Windows: while several connections compete and one of them is light (its turn took all it
had waiting, under half a quantum: :attr:`IngressInbox.contended`), each may have at most
``--ingress-window`` bytes in the log not yet applied; a connection whose window is full
passes its turn.  A message waits for everything ahead of it in the log to be written,
replicated and applied, so this is what keeps one client's flood from costing the others
their latency, while a lone sender may fill the log queue up to ``--max-log-inflight``
(a deep queue keeps the disk busy and delays only itself).  Where every competing
connection is heavy (bulk writers, each with more waiting than a turn takes), nobody is
behind a flood that is not also its own: no windows, so that enough log is in flight to
keep the pipeline full (with 4 clients of 1 KiB messages, windows halved the throughput).
:meth:`resume` (called after every drive of the consensus module) starts the next cycle
once messages may be taken again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from ..core.base import IngressSource
from ..protocol.consensus import ConsensusMessage
from ..protocol.ingress import IngressMessage

T = TypeVar("T")

Inbound = IngressMessage | ConsensusMessage | IngressSource

CONTENTION_WINDOW = 0.25
"""Seconds after a turn that took messages from several connections during which the
log queue is kept short (a closed-loop client's queue is empty between its replies
and its next messages: that must not let a flood fill the queue meanwhile)."""


SEVERAL_WITHIN = 0.005
"""Seconds: two client connections whose messages come this close count as sending
together (:meth:`IngressInbox.notify_soon`)."""


class SourceQueue:
    """One client connection's decoded messages not yet taken by a duty cycle."""

    __slots__ = (
        "bytes",
        "chunks",
        "deficit",
        "flight",
        "in_flight",
        "on_drained",
        "ready",
        "room",
        "source",
    )

    def __init__(self, source: IngressSource) -> None:
        self.source = source
        #: ``[messages, wire bytes]`` per receive, oldest first
        self.chunks: deque[list[Any]] = deque()
        self.bytes = 0
        self.deficit = 0
        #: bytes taken into the log and not yet applied, and where each turn's end
        #: was in the log: ``[position, bytes]``, oldest first
        self.in_flight = 0
        self.flight: deque[list[int]] = deque()
        self.ready = False  # in the inbox's round
        self.room: trio.Event | None = None  # its reader waits for room
        #: the connection closed while messages were waiting: called once they are taken
        self.on_drained: Callable[[IngressSource], None] | None = None


@dataclass
class IngressInbox:
    """Messages decoded by the ingress and member-link readers, for the duty cycle."""

    quantum: int = 16 << 10
    max_backlog: int = 256 << 10
    max_queued: int = 16 << 20
    #: member messages (and, in a taken batch, the client messages chosen for it)
    messages: list[Inbound] = field(default_factory=list)
    #: set: the consensus agent should run a duty cycle (it replaces the event when it
    #: wakes, so a reader's cycle in between cannot strand it on an old one)
    wake: trio.Event = field(default_factory=trio.Event)
    #: handles the messages in the caller's task (the node's duty cycle); without it the
    #: consensus agent is woken to take them
    process: Callable[[], None] | None = None
    #: a reader is waiting for the end of the scheduler's batch to have them handled
    pending: bool = False
    #: the client connection whose messages came last, when, and until when several
    #: count as sending (:meth:`notify_soon`)
    _last_sender: SourceQueue | None = None
    _last_sent: float = -1.0
    _several_until: float = -1.0
    #: the node's own work for the duty cycle (operator actions from the admin port,
    #: closed connections), each called with the cycle's time after the messages
    commands: list[Callable[[int], None]] = field(default_factory=list)
    #: False while client messages must wait (the log is full: back-pressure)
    gate: Callable[[], bool] = lambda: True
    #: seconds, for how long contention lasts (Trio's clock in the node)
    clock: Callable[[], float] = trio.current_time
    #: the log position applied (a leader's; anything else releases every window)
    applied: Callable[[], int] = lambda: 1 << 62
    window: int = 16 << 10
    """While several connections compete, each may have at most this many bytes in the
    log not yet applied: what another client's message may find ahead of it."""
    _turn: list[tuple[SourceQueue, int]] = field(default_factory=list)
    #: client connections with messages waiting, in their turn's order
    ready: deque[SourceQueue] = field(default_factory=deque)
    queued: int = 0
    """Bytes waiting in every client connection's queue."""
    blocked: list[SourceQueue] = field(default_factory=list)
    """Queues whose readers wait for room."""
    held_cycles: int = 0
    """Duty cycles that took no client message because the log was full."""
    contended_until: float = -1.0
    """Until when (Trio's clock) several connections count as competing: some turn
    found two or more with messages waiting in the last :data:`CONTENTION_WINDOW`
    seconds."""
    light_until: float = -1.0
    """Until when a light connection counts as competing: some turn of several took all
    that one of them had waiting, under half a quantum, in the last
    :data:`CONTENTION_WINDOW` seconds."""

    def deliver(self, message: Inbound) -> None:
        """A member link's message, for the next duty cycle."""
        self.messages.append(message)

    async def delivered(self) -> None:
        """A member link's reader is done with what it read: have it handled."""
        if self.messages:
            await self.notify_soon()

    @property
    def contended(self) -> bool:
        """Whether several connections compete for the log now, a light one among them:
        each then has a window (:attr:`window`) of log it may hold not yet applied."""
        return self._windows_bind(self.clock())

    def _windows_bind(self, now: float) -> bool:
        return self.contended_until >= now and self.light_until >= now

    async def notify_soon(self, queue: SourceQueue | None = None) -> None:
        """Messages were added (by ``queue``'s reader, or a member link's: None): have
        them handled now, or once the other readers that woke with this one (in the
        same scheduler pass) have added theirs.

        While several client connections send (two of them within
        :data:`SEVERAL_WITHIN` of each other, in the last :data:`CONTENTION_WINDOW`),
        the first reader yields once and then runs the duty cycle for all of them, and
        the others see it pending and go back to reading: four sessions' frames that
        arrive together cost one duty cycle (one replication send, one sync on each
        follower) instead of four.  While one connection sends alone, its reader (and
        a member link's) runs the duty cycle at once: nothing else would come in the
        yield, a pass of the scheduler (an ``epoll`` call and a task switch) that was a
        third of a leader's passes at one message in flight."""
        if self.pending:
            return
        now = self.clock()
        if queue is not None:
            if queue is not self._last_sender:
                if now - self._last_sent < SEVERAL_WITHIN:
                    self._several_until = now + CONTENTION_WINDOW
                self._last_sender = queue
            self._last_sent = now
        if now > self._several_until:
            self.notify()
            return
        self.pending = True
        try:
            await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self.pending = False
        self.notify()

    def notify(self) -> None:
        """Messages were added: have them handled now."""
        if self.process is not None:
            self.process()
        else:
            self.wake.set()

    async def call(self, command: Callable[[int], T]) -> T:
        """Run ``command`` (given the cycle's time) in a duty cycle, after the messages
        already here, and return what it returns."""
        done = trio.Event()
        results: list[T] = []

        def run(now_ns: int) -> None:
            try:
                results.append(command(now_ns))
            finally:
                done.set()

        self.commands.append(run)
        self.notify()
        await done.wait()
        return results[0]

    # ------------------------------------------------------------------ client queues

    def add(self, queue: SourceQueue, messages: list[Any], size: int) -> None:
        """A reader decoded ``messages`` from ``size`` bytes of ``queue``'s connection."""
        queue.chunks.append([messages, size])
        queue.bytes += size
        self.queued += size
        if not queue.ready:
            queue.ready = True
            self.ready.append(queue)

    def full(self, queue: SourceQueue) -> bool:
        """Whether ``queue``'s reader must wait before reading again."""
        return queue.bytes >= self.max_backlog or self.queued >= self.max_queued

    async def wait_for_room(self, queue: SourceQueue) -> None:
        while self.full(queue):
            room = queue.room = trio.Event()
            self.blocked.append(queue)
            await room.wait()

    def close(self, queue: SourceQueue, on_closed: Callable[[IngressSource], None]) -> None:
        """``queue``'s connection closed: ``on_closed`` now, or after the duty cycle
        that takes its last messages (a close request sent just before still counts)."""
        if queue.ready:
            queue.on_drained = on_closed
        else:
            on_closed(queue.source)

    def take(self) -> list[Inbound]:
        """The next duty cycle's messages: every member message, and one turn of the
        client connections' (unless the gate is shut)."""
        batch, self.messages = self.messages, []
        if self.ready:
            if self.gate():
                self._take_turn(batch)
            else:
                self.held_cycles += 1
            if self.blocked:
                self._unblock()
        return batch

    def resume(self) -> None:
        """Run another cycle soon if client messages wait that may be taken now (the
        gate open, and some connection's window not full)."""
        if self.ready and not self.wake.is_set() and self.gate() and self._may_take():
            self.wake.set()

    def sequenced(self, position: int) -> None:
        """The duty cycle has put this turn's messages in the log, all before
        ``position``: they count against their connections' windows until applied."""
        for queue, size in self._turn:
            queue.flight.append([position, size])
            queue.in_flight += size
        self._turn.clear()

    def _release(self, queue: SourceQueue, applied: int) -> None:
        flight = queue.flight
        while flight and flight[0][0] <= applied:
            queue.in_flight -= flight.popleft()[1]

    def _may_take(self) -> bool:
        if not self.contended:
            return True  # no window binds
        applied = self.applied()
        for queue in self.ready:
            self._release(queue, applied)
            if queue.in_flight < self.window:
                return True
        return False

    def _take_turn(self, batch: list[Inbound]) -> None:
        ready = self.ready
        quantum = self.quantum
        taken = 0
        now = self.clock()
        several = len(ready) > 1
        if several:
            self.contended_until = now + CONTENTION_WINDOW
        windowed = self._windows_bind(now)
        light = quantum // 2
        applied = self.applied()
        turn = self._turn
        given = 0
        for _ in range(len(ready)):
            queue = ready.popleft()
            self._release(queue, applied)
            if windowed and queue.in_flight >= self.window:
                ready.append(queue)  # its window is full: its turn passes
                continue
            given += 1
            queue.deficit += quantum
            before = queue.bytes
            chunks = queue.chunks
            mark = len(batch)
            batch.append(queue.source)
            while chunks:
                chunk = chunks[0]
                messages, size = chunk
                if size <= queue.deficit:
                    chunks.popleft()
                    batch.extend(messages)
                    queue.deficit -= size
                    taken += size
                    queue.bytes -= size
                    continue
                # take the part the deficit pays for (each message costs the chunk's
                # average), and keep the rest for the next turn
                count = len(messages) * queue.deficit // size
                if count:
                    part = size * count // len(messages)
                    batch.extend(messages[:count])
                    del messages[:count]
                    chunk[1] = size - part
                    queue.deficit -= part
                    taken += part
                    queue.bytes -= part
                break
            if len(batch) == mark + 1:
                batch.pop()  # nothing taken this turn: no need to name the connection
            else:
                turn.append((queue, before - queue.bytes))
            if chunks:
                ready.append(queue)
            else:
                if several and before < light:
                    self.light_until = now + CONTENTION_WINDOW
                queue.ready = False
                queue.deficit = 0
                if queue.on_drained is not None:
                    self.commands.append(_closing(queue.on_drained, queue.source))
                    queue.on_drained = None
        self.queued -= taken
        if ready and given:
            self.wake.set()  # more waiting: another cycle once the readers have run

    def _unblock(self) -> None:
        still = []
        for queue in self.blocked:
            if self.full(queue):
                still.append(queue)
            elif queue.room is not None:
                queue.room.set()
                queue.room = None
        self.blocked = still


def _closing(
    on_closed: Callable[[IngressSource], None], source: IngressSource
) -> Callable[[int], None]:
    return lambda now_ns: on_closed(source)

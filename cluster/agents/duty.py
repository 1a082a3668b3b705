"""The consensus module's duty cycle, and the two agents that run it when nothing else
does (the consensus agent and the slow tick).

Aeron runs its consensus module in one agent's duty cycle; here the cycle runs right
where something changed (:meth:`DutyCycle.kick`, :meth:`DutyCycle.process_inbox`), in
the task that changed it: an ingress or member-link reader that decoded messages, the
archive agent once a write is durable, the log agent, the slow tick.  A task switch per
hop costs more than the work.  :func:`cluster.core.driver.drive` does the cycle's work;
:class:`DutyCycle` is its :class:`~cluster.core.driver.Shell`: it writes the new log,
applies what is committed, sends what is queued, and reacts to the module's events (a
role change starts or cancels the leader's replicators, :class:`~.replication.Leadership`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
import trio.lowlevel

from ..config import NodeConfig
from ..core.base import Event, IngressSource, LeaderReady, MemberRefused, RoleChanged
from ..core.consensus import ConsensusModule
from ..core.driver import drive
from ..core.service_container import ServiceContainer
from ..core.service_errors import ServiceFailure
from ..core.sessions import STALL_NS
from ..protocol.enums import Role
from .catchup import CatchUp
from .consensus import PeerLinks
from .egress import EgressPublisher
from .inbox import IngressInbox
from .log import ArchiveAgent, LogAgent, LogBuffer
from .replication import Leadership
from .timings import Timings
from .upkeep import LeaderWatchdog

log = logging.getLogger("cluster.node")

CLOCK_STEP_NS = 1_000_000_000
"""A change of the wall clock against the monotonic clock this large, between two slow
ticks, is a step (logged); less is a slew or the clocks' reading jitter."""


class DutyCycle:
    """Drives one member's consensus module (the driver's Shell).

    Made once the module and its service container are; the agents that kick it (made
    with :meth:`kick`) are given to it by :meth:`attach`, and the node's nursery (where
    a leader's replicators and a failed service's stop run) by :attr:`nursery`."""

    archive: ArchiveAgent
    log_agent: LogAgent
    catchup: CatchUp
    watchdog: LeaderWatchdog

    def __init__(
        self,
        config: NodeConfig,
        cm: ConsensusModule,
        container: ServiceContainer,
        *,
        inbox: IngressInbox,
        links: PeerLinks,
        egress: EgressPublisher,
        log_buffer: LogBuffer,
        leadership: Leadership,
        timings: Timings,
        now_ns: Callable[[], int],
        epoch_offset: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.cm = cm
        self.container = container
        self.inbox = inbox
        self.links = links
        self.egress = egress
        self.log_buffer = log_buffer
        self.leadership = leadership
        self.timings = timings
        self.now_ns = now_ns
        self.epoch_offset = epoch_offset
        """The wall clock less the monotonic clock, read every slow tick (None: the
        offset the module was made with stays)."""
        self.nursery: trio.Nursery | None = None
        self.failure: ServiceFailure | None = None
        """Why the service stopped this member (``--on-service-error stop``): nothing
        more is applied."""
        self.role_changed = trio.Event()
        """Set (and replaced) each time this member's role changes."""
        self._in_cycle = False
        inbox.process = self.process_inbox
        inbox.gate = self.log_has_room
        inbox.applied = self._applied_for_windows

    def attach(
        self,
        archive: ArchiveAgent,
        log_agent: LogAgent,
        catchup: CatchUp,
        watchdog: LeaderWatchdog,
    ) -> None:
        """The agents this cycle hands work to (each made with :meth:`kick`)."""
        self.archive = archive
        self.log_agent = log_agent
        self.catchup = catchup
        self.watchdog = watchdog

    # ------------------------------------------------------------------ the cycle

    @trio.lowlevel.enable_ki_protection  # a callback's own KeyboardInterrupt is its error
    def kick(self) -> None:
        """After the consensus module changed: drive it (react to its events, write the
        new log, apply what is committed, send what is queued), right here in the
        caller's task.  Only what has to wait (a write behind another, a truncation, a
        retry after a failed write) goes to the archive agent's task, which kicks again
        once it is done."""
        if self.failure is not None:
            return  # stopping: nothing more is applied (the failed chunk would be again)
        self.watchdog.push()
        now = self.now_ns()
        self.timings.before_drive(self.cm, now)
        try:
            drive(self.cm, self, now)
        except ServiceFailure as failure:  # logged where it was raised
            self.failure = failure
            if self.nursery is not None:  # the node's run() raises it once all stopped
                self.nursery.start_soon(self.log_agent.stop, self.nursery.cancel_scope)
            return
        self.timings.after_drive(self.cm, now)
        self.inbox.resume()

    def process_inbox(self) -> None:
        """Handle every decoded ingress and member message, then drive the module.

        Runs in the task that decoded them (an ingress or member-link reader) or, when
        that would re-enter, in the consensus agent's task."""
        inbox = self.inbox
        if self._in_cycle:
            inbox.wake.set()
            return
        self._in_cycle = True
        began = self.timings.clock()
        try:
            batch = inbox.take()
            now = self.now_ns()
            self.cm.on_batch(batch, now)
            inbox.sequenced(self.cm.log.published_position)
            if inbox.commands:
                commands, inbox.commands = inbox.commands, []
                for command in commands:
                    command(now)
            self.cm.consensus_work(now)
            self.kick()
        finally:
            self._in_cycle = False
            self.timings.cycle(began)

    def log_has_room(self) -> bool:
        """Whether a leader may sequence client messages: the log it holds not yet both
        durable here and applied is under ``--max-log-inflight`` (back-pressure)."""
        if self.cm.role is not Role.LEADER:
            return True
        held = min(self.log_buffer.applied, self.archive.written)
        return self.cm.log.published_position - held < self.config.max_log_inflight

    def _applied_for_windows(self) -> int:
        """The log applied, for the inbox's windows (a leader's; a follower's bind none)."""
        return self.log_buffer.applied if self.cm.role is Role.LEADER else 1 << 62

    # ------------------------------------------------------------------ the driver's Shell

    @property
    def applied_position(self) -> int:
        return self.log_buffer.applied

    def persist(self) -> None:
        self.catchup.persist()  # a snapshot received from the leader
        archive = self.archive
        if self.cm.log.buffer:
            archive.take()
        if archive.pending and not archive.write_now():
            archive.kick()

    def apply(self, commit_position: int) -> bool:
        return self.log_agent.apply_committed() > 0

    def flush(self) -> None:
        self.links.flush()
        self.egress.flush()

    def answer_queries(self) -> None:
        self.container.answer_queries(self.log_buffer.applied)

    def on_event(self, event: Event) -> None:
        if isinstance(event, RoleChanged):
            self._on_role_change(event.role)
        elif isinstance(event, MemberRefused):
            self.links.close_inbound(event.member_id, event.reason)
        elif isinstance(event, LeaderReady):
            self.container.set_role(Role.LEADER)
            log.info(
                "member %d leads term %d: ready at log position %d",
                self.config.member_id,
                event.leadership_term_id,
                event.log_position,
            )

    def _on_role_change(self, role: Role) -> None:
        self.role_changed.set()
        self.role_changed = trio.Event()
        self.timings.reset()
        if self.config.archive_io == "auto":
            self.archive.inline = role is not Role.LEADER
            self.archive.inline_when_idle = role is Role.LEADER
        if role is Role.LEADER:
            if self.nursery is not None:
                self.nursery.start_soon(self.leadership.run, name="leadership")
        else:
            self.leadership.cancel()
            self.container.set_role(Role.FOLLOWER)
            self.cm.session_manager.reset(self.container.session_records(), self.now_ns())

    # ------------------------------------------------------------------ the transports' news

    def on_egress_connected(self, egress_id: int) -> None:
        self.cm.session_manager.on_egress_connected(egress_id)
        self.kick()

    def on_egress_failed(self, egress_id: int) -> None:
        self.cm.session_manager.on_egress_failed(egress_id)
        self.kick()

    def on_source_closed(self, source: IngressSource) -> None:
        self.cm.session_manager.on_source_closed(source)
        self.kick()

    # ------------------------------------------------------------------ agents

    async def run_consensus(self) -> None:
        """The consensus agent: a cycle whenever one was asked for that could not run
        where it was asked (it would have re-entered one)."""
        inbox = self.inbox
        while True:
            await inbox.wake.wait()
            inbox.wake = trio.Event()
            self.process_inbox()
            await trio.lowlevel.checkpoint()

    async def run_slow_tick(self) -> None:
        """Every ``--slow-tick-interval``: pending sessions, session timeouts, timers."""
        interval = self.config.slow_tick_interval / 1e9
        deadline = trio.current_time()
        while True:
            deadline += interval
            await trio.sleep_until(deadline)
            now = self.now_ns()
            late = int((trio.current_time() - deadline) * 1e9)
            if late >= STALL_NS:  # this process did not run: not its clients' fault
                self.cm.session_manager.forgive_stall(late)
            if self.epoch_offset is not None:
                self._read_wall_clock()
            self.cm.on_slow_tick(now)
            self.timings.sample(self.cm.followers, now)  # a leader's (else none)
            self.kick()
            if trio.current_time() > deadline + interval:
                deadline = trio.current_time()  # overran: don't try to catch up

    def _read_wall_clock(self) -> None:
        """Cluster time follows this member's wall clock (Aeron's cluster clock is the
        leader's wall clock): a step of it (an NTP correction, an operator) is noticed
        here, within a slow tick.  Forward, cluster time moves on at once; back, it
        stands at the last timestamp of the log until the clock passes it again
        (:meth:`~cluster.core.log.ReplicatedLog.cluster_time`)."""
        assert self.epoch_offset is not None
        step = self.cm.log.set_epoch_offset(self.epoch_offset())
        if step >= CLOCK_STEP_NS:
            log.warning("wall clock jumped forward by %.3f s: cluster time follows it", step / 1e9)
        elif step <= -CLOCK_STEP_NS:
            log.warning(
                "wall clock stepped back by %.3f s: cluster time stays at the log's last "
                "timestamp until the clock passes it",
                -step / 1e9,
            )

"""A Triarch cluster node: ``python -m cluster.node``.

The node is a Trio nursery with one task per agent (DESIGN.md section 1)::

    node nursery
    ├── ingress     accepts clients, decodes frames into the ingress inbox
    ├── consensus   drains the inbox into the ConsensusModule (sequencing the log)
    ├── archive     appends the encoded log in batches, fdatasync, reports the position
    ├── log         applies committed entries to the clustered service
    ├── slow_tick   every 10 ms: pending sessions, session timeouts, timers
    └── egress      one connection per session, batched writes

The consensus module and the service container are sans-IO objects from
``cluster.core``; the agents only move bytes and time in and out of them.  A failure in
any agent cancels the nursery, so the node never runs half alive.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from .agents.admin import AdminServer
from .agents.catchup import CatchUp
from .agents.consensus import PeerLinks
from .agents.duty import DutyCycle
from .agents.egress import EgressPublisher
from .agents.exporter import MetricsServer, sees_quorum
from .agents.inbox import IngressInbox
from .agents.ingress import IngressAgent
from .agents.log import ArchiveAgent, LogAgent, LogBuffer
from .agents.replication import Leadership
from .agents.silence import silence_bound
from .agents.snapshot import SnapshotAgent
from .agents.stalls import StallWatch
from .agents.timings import Timings
from .agents.upkeep import ArchiveVerifier, LeaderWatchdog, save_node_state
from .agents.worker import WorkerThread, run_in_thread, run_inline
from .archive.errors import ArchiveCorruptionError
from .config import NodeConfig, format_ingress_endpoints, members_digest
from .core.auth import Authenticator
from .core.base import ConsensusConfig
from .core.consensus import ConsensusModule
from .core.service_container import ServiceContainer
from .core.service_errors import ServiceErrorPolicy, ServiceFailure
from .core.terms import TermHistory
from .datadir import DataDir
from .memory import give_back_memory
from .protocol.admin import MemberStatus
from .protocol.enums import ClusterAction, ModuleState, Role
from .recovery import recover
from .security import admin_authorisation
from .service import ClusteredService
from .status import node_status
from .transport.base import Network
from .transport.tcp import TcpNetwork

log = logging.getLogger("cluster.node")


RunBlocking = Callable[..., Awaitable[Any]]


class Node:
    """One cluster member: its state, its agents and its lifecycle."""

    duty: DutyCycle
    catchup: CatchUp

    def __init__(
        self,
        config: NodeConfig,
        service: ClusteredService,
        *,
        authenticator: Authenticator | None = None,
        network: Network | None = None,
        clock_ns: Callable[[], int] | None = None,
        wall_clock_ns: Callable[[], int] | None = None,
        rng: random.Random | None = None,
        run_blocking: RunBlocking | None = None,
    ) -> None:
        """``network``, ``clock_ns`` (monotonic ns), ``wall_clock_ns`` (epoch ns: the wall
        clock, read again every slow tick, so cluster time follows its steps forward and
        holds through its steps back), ``rng`` and ``run_blocking`` (how archive reads,
        snapshots and, with ``archive_io = "thread"``, log writes run: a worker thread
        by default) are the seams the deterministic simulator replaces."""
        self.config = config
        self.service = service
        self.network = network or TcpNetwork()
        self._clock_ns = clock_ns or time.monotonic_ns
        self._wall_clock_ns = wall_clock_ns or time.time_ns
        self.epoch_offset_ns = self.epoch_offset()
        """Epoch time less the monotonic clock at start-up (the stall finder's)."""
        self.rng = rng or random.Random()
        # session secrets from the seed in a simulation, so that it replays the same log
        self._token = secrets.token_bytes if rng is None else self.rng.randbytes
        self.run_blocking: RunBlocking = run_blocking or run_in_thread
        # Log writes off the loop: a thread of their own (a third of trio.to_thread's cost).
        self._log_writer: WorkerThread | None = None
        self.run_log_write: RunBlocking
        if config.archive_io == "inline":
            self.run_log_write = run_inline
        elif run_blocking is not None:
            self.run_log_write = run_blocking
        else:
            self._log_writer = WorkerThread("archive-writer")
            self.run_log_write = self._log_writer.run
        self.member = config.this_member
        self.members = config.member_list
        self.authenticator = authenticator
        self.ingress_port = self.member.ingress_port
        self._ready = trio.Event()
        self.closed = trio.Event()
        """Set once :meth:`run` has ended and released the data directory (its lock)."""
        self._stopping = False
        self._nursery: trio.Nursery | None = None
        self.started_ns = self.now_ns()
        self.timings = Timings()
        self.stalls = StallWatch(config.stall_threshold, self.epoch_offset_ns)
        self.archive_errors = 0
        """Records of this member's archive found corrupt (never shipped)."""

    @property
    def data_dir(self) -> Path:
        return Path(self.config.dir)

    def now_ns(self) -> int:
        return self._clock_ns()

    def epoch_offset(self) -> int:
        """The wall clock (epoch ns) less the monotonic clock, now."""
        return self._wall_clock_ns() - self._clock_ns()

    # ------------------------------------------------------------------ start-up

    def _open_storage(self) -> None:
        self.datadir = datadir = DataDir(self.config)
        self.recording_log = datadir.recording_log
        self.archive = datadir.archive
        self.node_state = datadir.node_state
        self.identity = datadir.identity
        self.storage = datadir.storage
        self._verified_from = datadir.verified_from

    def _build(self) -> None:
        cfg = self.config
        position = self.archive.position
        self.egress = EgressPublisher(
            self.network,
            max_backlog=cfg.max_egress_backlog,
            # the duty cycle is made after the consensus module, which needs this
            on_connected=lambda egress_id: self.duty.on_egress_connected(egress_id),
            on_failed=lambda egress_id: self.duty.on_egress_failed(egress_id),
        )
        self.inbox = IngressInbox(
            quantum=cfg.ingress_quantum,
            max_backlog=cfg.max_ingress_backlog,
            window=cfg.ingress_window,
        )
        self.links = PeerLinks(
            self.network,
            self.member,
            [m for m in self.members if m.member_id != cfg.member_id],
            self.inbox.deliver,
            delivered=self.inbox.delivered,
            max_frame_size=max(cfg.max_frame_size, 2 << 20),
            cluster_id=self.identity.cluster_id,
            hello_timeout=cfg.handshake_timeout / 1e9,
            members_digest=members_digest(self.members),
            keepalive_interval=cfg.leader_heartbeat_interval / 1e9,
            silence_timeout=silence_bound(
                cfg.leader_heartbeat_interval / 1e9, cfg.leader_heartbeat_timeout / 1e9
            ),
        )
        terms = TermHistory(
            [
                (e.leadership_term_id, e.term_base_log_position)
                for e in self.recording_log.entries
                if e.is_valid and e.type == 0
            ]
        )
        self.cm = ConsensusModule(
            ConsensusConfig(
                member_id=cfg.member_id,
                member_ids=tuple(m.member_id for m in self.members),
                **cfg.session_limits(),
                ingress_endpoints=format_ingress_endpoints(self.members),
                leader_heartbeat_interval_ns=cfg.leader_heartbeat_interval,
                leader_heartbeat_timeout_ns=cfg.leader_heartbeat_timeout,
                election_timeout_ns=cfg.election_timeout,
                startup_canvass_timeout_ns=cfg.startup_canvass_timeout,
                slow_disk_threshold_ns=cfg.slow_disk_threshold,
                slow_disk_period_ns=cfg.slow_disk_period,
            ),
            self.egress,
            self.authenticator,
            log_position=position,
            epoch_offset_ns=self.epoch_offset_ns,
            consensus=self.links,
            storage=self.storage,
            terms=terms,
            candidate_term_id=self.node_state.candidate_term_id,
            catching_up=not self.identity.voting,
            rng=self.rng,
            authorisation=admin_authorisation(self.config, self.authenticator),
            token=self._token,
        )
        self.container = ServiceContainer(
            *(self.service, self.cm, self.egress),
            member_id=cfg.member_id,
            clock_ns=self.now_ns,
            on_error=ServiceErrorPolicy(cfg.on_service_error, self.now_ns),
            max_kept_replies=cfg.max_kept_replies,
        )
        self.snapshots = SnapshotAgent(
            self.data_dir,
            self.storage,
            self.cm,
            self.container,
            self.run_blocking,
            self.shutdown,
        )
        self.container.on_cluster_action = self.snapshots.on_cluster_action
        self.verifier = ArchiveVerifier(self.archive, self.run_blocking, self._on_corrupt)
        self.log_buffer = LogBuffer(0)
        interval = cfg.leader_heartbeat_interval / 1e9
        self.leadership = Leadership(
            self.links.flush,
            lambda wait_for_log: self.catchup.replicators(
                interval, self.read_log, wait_for_log, self._on_corrupt
            ),
        )
        self.duty = duty = DutyCycle(
            cfg,
            self.cm,
            self.container,
            inbox=self.inbox,
            links=self.links,
            egress=self.egress,
            log_buffer=self.log_buffer,
            leadership=self.leadership,
            timings=self.timings,
            now_ns=self.now_ns,
            epoch_offset=self.epoch_offset,
        )
        self.archive_lock = trio.Lock()
        self.archive_agent = ArchiveAgent(
            self.archive,
            self.cm,
            self.log_buffer,
            duty.kick,
            self.run_log_write,
            lock=self.archive_lock,
            on_taken=self.leadership.on_log_taken,
            on_truncated=self.leadership.wake,
            clock_ns=self.now_ns,
            inline=cfg.archive_io != "thread",
            storage=self.storage,
        )
        self.log_agent = LogAgent(self.cm, self.container, self.log_buffer, duty.kick, self.links)
        self.catchup = CatchUp(self, duty.kick)  # compaction, snapshots to/from members
        self.ingress = IngressAgent(
            self.network,
            self.member.host,
            self.member.ingress_port,
            self.inbox,
            max_frame_size=cfg.max_frame_size,
            max_backlog=cfg.max_egress_backlog,
            on_closed=duty.on_source_closed,
            max_connections=cfg.max_connections,
            max_per_address=cfg.max_connections_per_address,
            handshake_timeout=cfg.handshake_timeout / 1e9,
            holds_session=self.cm.session_manager.holds_session,
        )
        self.watchdog = LeaderWatchdog(self.cm, self.now_ns, duty.kick)
        duty.attach(self.archive_agent, self.log_agent, self.catchup, self.watchdog)

    @trio.lowlevel.enable_ki_protection  # the service's callbacks run: see DutyCycle.kick
    def _recover(self) -> int:
        position = recover(
            data_dir=self.data_dir,
            recording_log=self.recording_log,
            archive=self.archive,
            cm=self.cm,
            container=self.container,
            log_buffer=self.log_buffer,
            known_commit=None if len(self.members) == 1 else self.node_state.commit_position,
            now_ns=self.now_ns(),
        )
        self.archive_agent.written = self.archive.position
        return position

    @property
    def recovered_position(self) -> int:
        return self.snapshots.recovered_position

    # ------------------------------------------------------------------ admin target

    @property
    def admin_endpoint(self) -> tuple[str, int]:
        return self.member.host, self.member.admin_port

    @property
    def max_frame_size(self) -> int:
        return self.config.max_frame_size

    @property
    def snapshots_taken(self) -> int:
        return self.snapshots.taken

    async def wait_snapshot(self, after: int) -> None:
        await self.snapshots.wait_taken(after)

    async def request_action(
        self, action: ClusterAction, *, terminate: bool = False
    ) -> tuple[bool, str]:
        """Put a cluster action on the log: it runs in the consensus duty cycle, after
        the messages already in the inbox."""
        control = self.cm.control
        return await self.inbox.call(lambda now: control.request(action, now, terminate=terminate))

    async def transfer_leadership(
        self, to: int | None = None, reason: str = ""
    ) -> tuple[bool, str]:
        """Hand leadership to member ``to`` (None: the most up-to-date voting follower)
        and wait, at most the election timeout and a heartbeat interval, until another
        member leads (:mod:`cluster.core.handover`)."""
        cm = self.cm
        term = cm.leadership_term_id
        why = await self.inbox.call(lambda now: cm.handover.start(now, to, reason or "requested"))
        if why:
            return False, f"cannot hand leadership over: {why}"
        target = cm.handover.target
        cfg = self.config
        with trio.move_on_after((cfg.election_timeout + cfg.leader_heartbeat_interval) / 1e9):
            while cm.role is Role.LEADER:
                await self.duty.role_changed.wait()
        if cm.role is Role.LEADER:
            return False, f"member {target} did not take leadership over: still leading term {term}"
        return (
            True,
            f"member {self.config.member_id} handed leadership of term {term} to member {target}",
        )

    def stop(self) -> None:
        """Stop as SIGTERM does (``cluster-tool stop``), after the current reply."""
        if self._nursery is not None:
            self._nursery.start_soon(self.shutdown, name="stop")

    def status(self) -> MemberStatus:
        """This member's :class:`MemberStatus` (``describe`` on the admin port)."""
        return node_status(self)

    @property
    def failure(self) -> ServiceFailure | None:
        """Why the service stopped this member (``--on-service-error stop``): raised by
        :meth:`run` once every agent has stopped."""
        return self.duty.failure

    # ------------------------------------------------------------------ the log, for others

    async def read_log(self, start: int, stop: int) -> bytes:
        """Log bytes ``[start, stop)``: from memory if still there, else from the archive."""
        buf = self.log_buffer
        if start >= buf.base:
            return buf.copy(start, stop)
        stop = min(stop, buf.base)
        async with self.archive_lock:
            return bytes(await self.run_blocking(self.archive.read_checked, start, stop))

    def _on_corrupt(self, exc: ArchiveCorruptionError) -> None:
        """A record of this member's archive failed its check: it is never shipped."""
        self.archive_errors += 1
        log.error("archive corruption, not shipped to any member: %s", exc)

    async def _signal_agent(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            log.info("received %s: shutting down", signal.Signals(signum).name)
            await self.shutdown()
            return

    # ------------------------------------------------------------------ lifecycle

    async def run(
        self,
        *,
        handle_signals: bool = True,
        freeze_gc: bool = False,
        task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Recover, elect, run every agent until shut down.

        ``freeze_gc`` (a node that owns its process: :func:`main`): once started, every
        object made so far (the modules, the recovered state) is put out of the cyclic
        collector's reach (:func:`gc.freeze`), so a full collection walks only what was
        made since: 12-27 ms of stopped event loop less each on the 2-core machine.
        With ``handle_signals``, SIGTERM and SIGINT are the node's from its first instant:
        one during start-up stops it as one later does (not the signal's default action)."""
        if not handle_signals:
            return await self._run(None, freeze_gc, task_status)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await self._run(signals, freeze_gc, task_status)

    async def _run(
        self, signals: AsyncIterator[int] | None, freeze_gc: bool, task_status: Any
    ) -> None:
        self.started_ns = self.now_ns()
        try:
            await self.run_blocking(self._open_storage)
        except BaseException:
            self.closed.set()  # nothing was opened
            raise
        self.stalls.start()
        try:
            self._build()
            authenticator = self.cm.session_manager.admission.authenticator
            if authenticator.enforces_identity is False and self.config.authenticator:
                log.info("authenticator %s", self.config.authenticator)
            recovered = self._recover()
            async with trio.open_nursery() as nursery:
                self._nursery = self.duty.nursery = self.catchup.nursery = nursery
                self.snapshots.start(nursery, recovered)
                self.ingress_port = await nursery.start(self.ingress.run)
                await nursery.start(self.egress.run)
                await nursery.start(self.links.run)
                await nursery.start(AdminServer(self).run)
                if port := self.config.metrics_port:
                    quorum = partial(sees_quorum, self.cm, self.now_ns)
                    exporter = MetricsServer(self.member.host, port, self.status, quorum)
                    self.metrics_port = await nursery.start(exporter.run)
                self.cm.enter_election(self.now_ns(), "start-up", is_startup=True)
                nursery.start_soon(self.duty.run_consensus, name="consensus")
                nursery.start_soon(self.archive_agent.run, name="archive")
                nursery.start_soon(self.log_agent.run, name="log")
                nursery.start_soon(self.duty.run_slow_tick, name="slow_tick")
                applied = lambda: self.log_agent.applied_position  # noqa: E731
                saver = partial(save_node_state, self.storage, applied, self.run_blocking)
                nursery.start_soon(saver, name="state_save")
                start = self.archive.start_position
                verify = partial(self.verifier.run, start, self._verified_from)
                nursery.start_soon(verify, name="verify_archive")
                nursery.start_soon(self.catchup.run, name="catchup")
                nursery.start_soon(self.watchdog.run, name="leader_watchdog")
                if signals is not None:
                    nursery.start_soon(self._signal_agent, signals, name="signals")
                self.archive_agent.kick()
                log.info(
                    "node %d ready: ingress %s:%d, data %s",
                    self.config.member_id,
                    self.member.host,
                    self.ingress_port,
                    self.data_dir,
                )
                if freeze_gc:  # this process is the node's: its memory too
                    gc.freeze()
                    trim = self.config.memory_trim_interval / 1e9
                    nursery.start_soon(give_back_memory, trim, name="give_back_memory")
                self._ready.set()
                task_status.started(self)
            if self.duty.failure is not None:
                raise self.duty.failure
        finally:
            self.stalls.stop()
            try:
                self.container.terminate()
            finally:
                if self._log_writer is not None:
                    self._log_writer.close()
                self.datadir.close()
                self.closed.set()

    async def shutdown(self, drain_timeout: float = 5.0) -> None:
        """Graceful stop: no new ingress, log flushed to disk and applied, egress flushed."""
        if self._stopping or self._nursery is None:
            return
        self._stopping = True
        alone = self.cm.control.module_state in (ModuleState.ACTIVE, ModuleState.SUSPENDED)
        if alone and self.cm.is_ready_leader and len(self.members) > 1:
            # this member alone stops (not a SHUTDOWN or ABORT of the cluster): it hands
            # leadership over first, so the others go on within a round trip, not a
            # leader heartbeat timeout
            ok, message = await self.transfer_leadership(reason="this member is stopping")
            (log.info if ok else log.warning)("%s", message)
        self.cm.control.leave(ModuleState.TERMINATING)
        with trio.move_on_after(drain_timeout) as scope:
            await self.archive_agent.wait_idle()
            while self.log_agent.applied_position < self.cm.commit_position:
                self.log_agent.kick()
                await trio.sleep(0.001)
            applied = self.log_agent.applied_position
            if applied > self.node_state.commit_position:  # the next start knows it all
                with contextlib.suppress(OSError):
                    await self.run_blocking(partial(self.node_state.save, commit_position=applied))
            if self.cm.role is Role.LEADER:
                # followers must learn the final commit position (a termination
                # action's) before this leader's links close
                self.cm.replication.send_commit_position()
                self.links.flush()
                with trio.move_on_after(1.0):
                    await self.links.wait_sent()
            with trio.move_on_after(1.0):
                await self.egress.drain()
                await self.ingress.drain()  # after flushing what they carry
        if scope.cancelled_caught:
            log.warning("shutdown drain timed out after %.1fs", drain_timeout)
        self._nursery.cancel_scope.cancel()


if __name__ == "__main__":  # python -m cluster.node: the command line is cluster.launch's
    import runpy

    runpy.run_module("cluster.launch", run_name="__main__", alter_sys=True)

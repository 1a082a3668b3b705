"""Admin server: the member's admin port, what ``cluster-tool`` talks to.

One task serves ``node.member.admin_port`` through the node's :class:`Network`; each
connection reads framed :class:`~cluster.protocol.admin.AdminCommand`\\ s and answers each
with an :class:`~cluster.protocol.admin.AdminReply` (one at a time, in order).  Bad bytes
get a last ``AdminReply(correlation_id=-1, ok=False)`` and the connection is closed.

The server depends only on an :class:`AdminTarget` (the node implements it): it never
reaches into the node's parts.

Queries (their ``body`` is JSON):

- ``describe``: a :class:`~cluster.protocol.admin.MemberStatus` (role, terms, positions,
  election and module state, sessions, counters, ingress statistics, the leader's view
  of its followers, member links, snapshots).
- ``recording-log``: every recording-log entry.
- ``errors``: this process's distinct error log (:mod:`cluster.errorlog`): one record per
  distinct WARNING-or-worse error with its count and first and last times, the one seen
  most recently last; ``limit=N`` keeps the last N.  The node's ``main()`` installs the log
  before anything logs; a node started in-process without it gets one of its own on the
  ``cluster`` logger while the server runs.  The body is the list of records, or, with
  ``summary=1``, ``{"entries": [...], "distinct": N, "evicted": N, "total": N}``.  While
  the member's writes fail (a full disk), the reply's ``message`` says so ("DISK FULL for
  12 s: ...").

Commands that change the cluster (``snapshot``, ``suspend``, ``resume``, ``shutdown``,
``abort``, ``invalidate-latest-snapshot``, ``transfer-leadership``) put a cluster
action on the log (the request enters the node's inbox like any other message; leader
only, Aeron's refusals otherwise), edit the recording log, or hand leadership over
(``transfer-leadership``, with ``to`` a member id, or none: the leader picks), or stop
this one member as SIGTERM does (``stop``).  **They
are refused unless the connection comes from a loopback address** (127.0.0.0/8 or ::1):
the admin port has no authentication, so a member bound to a routable address still
only lets its own host change it.

Backups (``backup-query``, ``backup-read``: :mod:`cluster.backup.serve`) read the
member's whole state (its snapshots and its committed log, in bounded chunks, file reads
in a worker thread): **they are refused like the commands above** (a loopback address
without TLS, an admin principal with it), though they change nothing.  Streams that
are not sockets (the in-memory simulator's) count as local.  Queries are open to anyone
who can reach the port: firewall it like the consensus port.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from ..archive.recording_log import (
    CM_SERVICE_ID,
    ENTRY_TYPE_LOG_RESET,
    ENTRY_TYPE_LOG_START,
    ENTRY_TYPE_SNAPSHOT,
    ENTRY_TYPE_TERM,
    RecordingLog,
)
from ..backup.serve import COMMANDS as BACKUP_COMMANDS
from ..backup.serve import BackupSource
from ..backup.serve import handle as backup_handle
from ..config import NodeConfig
from ..errorlog import DistinctErrorLog, installed
from ..protocol.admin import AdminCommand, AdminReply, MemberStatus, encode_body
from ..protocol.codec import ADMIN
from ..protocol.enums import ClusterAction
from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder, encode_frame
from ..security import client_cert
from ..transport.base import Network
from ..transport.gate import ConnectionGate, default_share, gated
from .snapshot import SnapshotAgent

log = logging.getLogger("cluster.admin")

DEFAULT_SNAPSHOT_TIMEOUT = 30.0
MUTATING = frozenset(
    {
        "snapshot",
        "suspend",
        "resume",
        "shutdown",
        "abort",
        "invalidate-latest-snapshot",
        "transfer-leadership",
        "stop",
    }
)
READS_STATE = frozenset(BACKUP_COMMANDS)
"""Queries that read the whole state (backups): access as :data:`MUTATING`."""
_ENTRY_TYPES = {
    ENTRY_TYPE_TERM: "TERM",
    ENTRY_TYPE_SNAPSHOT: "SNAPSHOT",
    ENTRY_TYPE_LOG_START: "LOG_START",
    ENTRY_TYPE_LOG_RESET: "LOG_RESET",
}


def peer_is_local(stream: trio.abc.Stream) -> bool:
    """True for a loopback peer (127.0.0.0/8, ::1) or a stream that is not a socket."""
    if not isinstance(stream, trio.SocketStream):
        return True
    try:
        address = stream.socket.getpeername()
    except OSError:
        return False
    if not isinstance(address, tuple):  # AF_UNIX: same host
        return True
    try:
        ip = ipaddress.ip_address(str(address[0]).partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


class AdminTarget(BackupSource, Protocol):
    """What the admin server needs of a node (and, for backups, :class:`BackupSource`)."""

    @property
    def network(self) -> Network: ...

    @property
    def config(self) -> NodeConfig: ...

    @property
    def admin_endpoint(self) -> tuple[str, int]:
        """``(host, port)`` to serve."""
        ...

    @property
    def max_frame_size(self) -> int: ...

    @property
    def recording_log(self) -> RecordingLog: ...

    @property
    def snapshots_taken(self) -> int:
        """Snapshots this member has taken since it started."""
        ...

    def status(self) -> MemberStatus: ...

    async def request_action(
        self, action: ClusterAction, *, terminate: bool = False
    ) -> tuple[bool, str]:
        """Put a cluster action on the log (through the node's inbox); ``(accepted,
        message)``."""
        ...

    async def wait_snapshot(self, after: int) -> None:
        """Return once more than ``after`` snapshots have been taken."""
        ...

    def stop(self) -> None:
        """Stop this member as SIGTERM does (a leader hands leadership over first)."""
        ...

    async def transfer_leadership(
        self, to: int | None = None, reason: str = ""
    ) -> tuple[bool, str]:
        """Hand this leader's leadership to member ``to`` (None: the most up-to-date
        voting follower) and wait until another member leads; ``(done, message)``."""
        ...

    @property
    def snapshots(self) -> SnapshotAgent:
        """Its snapshots: taken, failed (and why)."""
        ...


Handler = Callable[[AdminCommand], Awaitable[AdminReply]]


class AdminServer:
    """Serves one node's admin port (see the module docstring)."""

    def __init__(self, node: AdminTarget) -> None:
        self.node = node
        process_log = installed()
        self._own_log = process_log is None
        """No process-wide log (an in-process node): one of its own while it runs."""
        # `is None`, not `or`: a log with no entry yet is empty, so false (it has a
        # length); `or` made a member that had logged nothing before this point (one
        # with certificates: no "no authenticator" warning) keep a second, unattached
        # log, and `errors` said "0 distinct errors" for ever
        self.errors: DistinctErrorLog = DistinctErrorLog() if process_log is None else process_log
        self.connections = 0
        self.open_connections = 0
        self.gate: ConnectionGate | None = None
        """``--max-admin-connections``, counted at accept (before a TLS handshake), half
        of it (at least 4) per source address; an admin principal's connection (TLS) is
        proven (:meth:`~cluster.transport.gate.ConnectionGate.prove`)."""
        self.commands = 0
        self._handlers: dict[str, Handler] = {
            "describe": self._describe,
            "recording-log": self._recording_log,
            "errors": self._errors,
            "snapshot": self._snapshot,
            "suspend": self._suspend,
            "resume": self._resume,
            "shutdown": self._shutdown,
            "abort": self._abort,
            "invalidate-latest-snapshot": self._invalidate_latest_snapshot,
            "transfer-leadership": self._transfer_leadership,
            "stop": self._stop,
            "backup-query": self._backup,
            "backup-read": self._backup,
        }

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        node = self.node
        cluster_logger = logging.getLogger("cluster")
        if self._own_log:
            cluster_logger.addHandler(self.errors)
        host, port = node.admin_endpoint
        cap = node.config.max_admin_connections
        self.gate = gate = ConnectionGate("admin port", cap, max(default_share(cap), cap // 2))
        try:
            await node.network.serve(host, port, gated(self._serve, gate), task_status=task_status)
        finally:
            if self._own_log:
                cluster_logger.removeHandler(self.errors)

    @property
    def refused_connections(self) -> int:
        """Closed at accept: over ``--max-admin-connections`` or an address's share."""
        return 0 if self.gate is None else self.gate.refused

    async def _serve(self, stream: trio.abc.Stream) -> None:
        self.connections += 1  # over the cap: closed at accept by self.gate
        self.open_connections += 1
        try:
            await self._serve_commands(stream)
        finally:
            self.open_connections -= 1

    async def _serve_commands(self, stream: trio.abc.Stream) -> None:
        allowed, cert = client_cert(stream)
        if not allowed:  # with TLS: a client certificate of this cluster's CA
            log.warning("closing admin connection: %s is not a client certificate", cert)
            await trio.aclose_forcefully(stream)
            return
        # control: from a loopback address without TLS; with TLS, an admin principal
        local = peer_is_local(stream) if cert is None else self._is_admin(cert.name)
        if cert is not None and local and self.gate is not None:
            self.gate.prove(stream)  # an admin principal: a flood cannot push it out
        decoder = FrameDecoder(64 * 1024)  # commands are small
        try:
            while True:
                data: bytes | bytearray = b""
                with trio.move_on_after(self.node.config.admin_idle_timeout / 1e9) as idle:
                    data = await stream.receive_some(64 * 1024)
                if idle.cancelled_caught or not data:
                    return  # closed, or idle (or half a frame) for too long
                for body in decoder.feed(data):
                    command = ADMIN.decode(body)
                    if not isinstance(command, AdminCommand):
                        raise ProtocolError(
                            f"expected an AdminCommand, got {type(command).__name__}"
                        )
                    reply = await self.execute(command, local=local)
                    await stream.send_all(encode_frame(reply))
        except ProtocolError as exc:
            log.warning("closing admin connection after bad frame: %s", exc)
            with trio.move_on_after(1.0):
                await stream.send_all(encode_frame(AdminReply(-1, False, str(exc))))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    def _is_admin(self, principal: str) -> bool:
        admins = {p.strip() for p in self.node.config.admin_principals.split(",") if p.strip()}
        return principal in (admins or {"admin"})

    async def execute(self, command: AdminCommand, *, local: bool = True) -> AdminReply:
        """Run one command; never raises (failures become ``ok=False`` replies)."""
        self.commands += 1
        handler = self._handlers.get(command.command)
        cid = command.correlation_id
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            return AdminReply(cid, False, f"unknown command {command.command!r} (known: {known})")
        if (command.command in MUTATING or command.command in READS_STATE) and not local:
            return AdminReply(
                cid,
                False,
                f"{command.command} refused: only allowed to an admin principal "
                "(--admin-principals) or, without TLS, from a loopback address on the "
                "member's own host",
            )
        try:
            return await handler(command)
        except Exception as exc:
            log.exception("admin command %s failed", command.command)
            return AdminReply(cid, False, f"{command.command} failed: {exc!r}")

    # ------------------------------------------------------------------ queries

    async def _describe(self, command: AdminCommand) -> AdminReply:
        return AdminReply(command.correlation_id, True, "", encode_body(self.node.status()))

    def recording_log(self) -> list[dict[str, Any]]:
        return [
            {
                "index": e.index,
                "recording_id": e.recording_id,
                "leadership_term_id": e.leadership_term_id,
                "term_base_log_position": e.term_base_log_position,
                "log_position": e.log_position,
                "timestamp": e.timestamp,
                "service_id": e.service_id,
                "entry_type": e.entry_type,
                "type": _ENTRY_TYPES.get(e.type, f"UNKNOWN({e.type})"),
                "valid": e.is_valid,
            }
            for e in self.node.recording_log.entries
        ]

    async def _backup(self, command: AdminCommand) -> AdminReply:
        return await backup_handle(self.node, command)

    async def _recording_log(self, command: AdminCommand) -> AdminReply:
        return AdminReply(command.correlation_id, True, "", encode_body(self.recording_log()))

    async def _errors(self, command: AdminCommand) -> AdminReply:
        limit = command.args.get("limit")
        count: int | None = None
        if limit is not None:
            try:
                count = int(limit)
            except ValueError:
                return AdminReply(command.correlation_id, False, f"bad limit {limit!r}")
        records = self.errors.records(count)
        now = self.node.status().disk.summary()  # the state now, not only its history
        body: Any = records
        if command.args.get("summary") == "1":
            body = {
                "entries": records,
                "distinct": len(self.errors),
                "evicted": self.errors.evicted,
                "total": self.errors.total,
            }
        return AdminReply(command.correlation_id, True, now, encode_body(body))

    # ------------------------------------------------------------------ cluster actions

    async def _request(self, action: ClusterAction, *, terminate: bool = False) -> tuple[bool, str]:
        ok, message = await self.node.request_action(action, terminate=terminate)
        if ok:
            log.info("%s (requested on the admin port)", message)
        return ok, message

    async def _snapshot(self, command: AdminCommand) -> AdminReply:
        cid = command.correlation_id
        try:
            timeout = float(command.args.get("timeout", DEFAULT_SNAPSHOT_TIMEOUT))
        except ValueError:
            return AdminReply(cid, False, f"bad timeout {command.args['timeout']!r}")
        if not timeout > 0 or math.isinf(timeout):
            return AdminReply(cid, False, f"bad timeout {command.args['timeout']!r}")
        node = self.node
        snapshots = node.snapshots
        before, failed_before = snapshots.taken, snapshots.failed
        ok, message = await self._request(ClusterAction.SNAPSHOT)
        if not ok:
            return AdminReply(cid, False, message)
        with trio.move_on_after(timeout):
            await snapshots.wait_taken(before, failed_before)
        if snapshots.taken <= before:
            if snapshots.failed > failed_before:
                return AdminReply(cid, False, snapshots.last_error)
            return AdminReply(cid, False, f"SNAPSHOT requested but not taken within {timeout:g}s")
        entry = node.recording_log.get_latest_snapshot(CM_SERVICE_ID)
        body = (
            {"log_position": entry.log_position, "leadership_term_id": entry.leadership_term_id}
            if entry is not None
            else {}
        )
        return AdminReply(cid, True, message, encode_body(body))

    async def _simple_action(
        self, command: AdminCommand, action: ClusterAction, *, terminate: bool = False
    ) -> AdminReply:
        ok, message = await self._request(action, terminate=terminate)
        return AdminReply(command.correlation_id, ok, message)

    async def _suspend(self, command: AdminCommand) -> AdminReply:
        return await self._simple_action(command, ClusterAction.SUSPEND)

    async def _resume(self, command: AdminCommand) -> AdminReply:
        return await self._simple_action(command, ClusterAction.RESUME)

    async def _shutdown(self, command: AdminCommand) -> AdminReply:
        return await self._simple_action(command, ClusterAction.SNAPSHOT, terminate=True)

    async def _abort(self, command: AdminCommand) -> AdminReply:
        return await self._simple_action(command, ClusterAction.ABORT)

    async def _transfer_leadership(self, command: AdminCommand) -> AdminReply:
        cid = command.correlation_id
        to: int | None = None
        if "to" in command.args:
            try:
                to = int(command.args["to"])
            except ValueError:
                return AdminReply(cid, False, f"bad member id {command.args['to']!r}")
        ok, message = await self.node.transfer_leadership(to, "requested on the admin port")
        if ok:
            log.info("%s (requested on the admin port)", message)
        return AdminReply(cid, ok, message)

    async def _stop(self, command: AdminCommand) -> AdminReply:
        log.info("stopping (requested on the admin port)")
        self.node.stop()
        return AdminReply(command.correlation_id, True, "stopping (a leader hands over first)")

    async def _invalidate_latest_snapshot(self, command: AdminCommand) -> AdminReply:
        invalidated = self.node.recording_log.invalidate_latest_snapshot()
        if invalidated:
            log.info("latest snapshot invalidated (requested on the admin port)")
        return AdminReply(
            command.correlation_id,
            True,
            f"invalidate latest snapshot: {'true' if invalidated else 'false'}",
            encode_body({"invalidated": invalidated}),
        )

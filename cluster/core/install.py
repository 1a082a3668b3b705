"""A follower receiving its leader's snapshot (Raft's InstallSnapshot receiver), sans-IO.

The leader sends a snapshot to a follower that needs log the leader has purged
(:mod:`cluster.core.replication`).  :class:`SnapshotReceiver` decides what to do with
each :class:`~cluster.protocol.consensus.SnapshotChunk`; the shell does the file work:

* it takes the chunks to write (:meth:`SnapshotReceiver.take_writes`), appends each to
  the transfer's file, syncs it and reports :meth:`SnapshotReceiver.on_written`; the
  follower then acknowledges the offset it holds durably;
* once the whole snapshot is durable (:attr:`SnapshotReceiver.complete`), it checks and
  installs it (the snapshot file recorded, the archive reset to begin at its position,
  the service and the consensus module loaded from it) and reports
  :meth:`~cluster.core.follower.FollowerReplica.on_snapshot_installed`, or
  :meth:`SnapshotReceiver.on_install_failed`.

What a peer sends is checked: :func:`~cluster.core.validate.check_consensus_message`
refuses chunks whose offsets, lengths or CRC are wrong; here a chunk of another term
than this member's leader's, or not where the transfer stands, is answered with the
offset held (the leader resends from there), and a new transfer (another snapshot, or
leader) replaces the old one.  A snapshot whose position this log already holds (it is
committed here, or an entry of the snapshot's term ends there) is never installed: the
answer :data:`~cluster.protocol.consensus.SNAPSHOT_HELD` asks for the log after it
instead, so an install never takes a member back.

**Bounded by the disk** (issue 33).  A new transfer is taken only if the shell's
:attr:`SnapshotReceiver.room` says the disk holds its declared length and a reserve;
otherwise it is answered :data:`~cluster.protocol.consensus.SNAPSHOT_NO_ROOM` and
nothing is written (a probe asks again).  A transfer that stops (its leader gone, a new
term, no chunk for ``timeout_ns``: :meth:`SnapshotReceiver.expire`, which the shell calls
now and then) or that another replaces is dropped, and its file goes to the shell to
remove at once (:meth:`SnapshotReceiver.take_dropped`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..protocol.consensus import SNAPSHOT_HELD, SNAPSHOT_NO_ROOM, SnapshotChunk, SnapshotChunkAck
from .base import ConsensusConfig, ConsensusPort, TermView
from .log import ReplicatedLog


@dataclass(frozen=True, slots=True)
class Transfer:
    """One snapshot from one leader: chunks of another transfer do not mix with it."""

    leadership_term_id: int
    leader_member_id: int
    log_position: int
    snapshot_term_id: int
    term_base_log_position: int
    length: int


@dataclass(frozen=True, slots=True)
class ChunkWrite:
    """Bytes for the shell to write at ``offset`` of ``transfer``'s file (offset 0: a new
    file)."""

    transfer: Transfer
    offset: int
    data: bytes


class SnapshotReceiver:
    """The transfer under way to this follower, if any."""

    __slots__ = (
        "_dropped",
        "_seen",
        "_writes",
        "complete",
        "config",
        "consensus",
        "heard",
        "installing",
        "log",
        "offset",
        "refused",
        "room",
        "transfer",
        "view",
        "writing",
    )

    def __init__(
        self, config: ConsensusConfig, log: ReplicatedLog, view: TermView, consensus: ConsensusPort
    ) -> None:
        self.config = config
        self.log = log
        self.view = view
        self.consensus = consensus
        self.transfer: Transfer | None = None
        self.offset = 0
        """Bytes of the transfer held durably."""
        self.writing = False
        """A chunk handed to the shell and not yet reported written."""
        self.complete: Transfer | None = None
        """The whole snapshot is durable: the shell installs it."""
        self.installing = False
        self._writes: list[ChunkWrite] = []
        self.room: Callable[[Transfer], bool] = lambda transfer: True
        """The shell's answer: may the disk take ``transfer`` (its length and a reserve)?"""
        self.refused: Transfer | None = None
        """The last transfer refused for want of room."""
        self.heard = 0
        """Messages of the transfer under way received (what :meth:`expire` watches)."""
        self._seen = (-1, 0)
        self._dropped: list[Transfer] = []

    def holds(self, position: int, term: int) -> bool:
        """Does this log already hold ``position``, where an entry of ``term`` ends?"""
        rlog = self.log
        if position <= rlog.commit_position:
            return True
        return (
            position <= rlog.published_position
            and rlog.is_boundary(position)
            and rlog.terms.term_at(position) == term
        )

    def on_chunk(self, msg: SnapshotChunk) -> None:
        """A chunk (or probe) from the leader this member follows (checked statelessly
        and for its term already)."""
        if (
            msg.leadership_term_id != self.view.leadership_term_id
            or msg.leader_member_id != self.view.leader_member_id
        ):
            return
        transfer = Transfer(
            msg.leadership_term_id,
            msg.leader_member_id,
            msg.log_position,
            msg.snapshot_term_id,
            msg.term_base_log_position,
            msg.length,
        )
        if transfer != self.transfer:
            if self.installing or self.writing:
                return  # answered once the work under way is done
            if self.holds(msg.log_position, msg.snapshot_term_id):
                self._ack(transfer, SNAPSHOT_HELD)
                return
            if (transfer == self.refused and msg.data) or not self.room(transfer):
                self.refused = transfer  # a probe asks again; chunks are not looked at
                self._drop()
                self._ack(transfer, 0, SNAPSHOT_NO_ROOM)
                return
            self._drop()
            self.refused = None
            self.transfer, self.offset, self.complete = transfer, 0, None
        self.heard += 1
        if not msg.data or self.writing or self.installing or msg.offset != self.offset:
            if not self.writing:
                self._ack(transfer, self.offset)  # a probe, or not where it stands
            return
        self.writing = True
        self._writes.append(ChunkWrite(transfer, msg.offset, msg.data))

    def expire(self, now_ns: int, timeout_ns: int) -> None:
        """Drop the transfer under way if it stopped: its leader is no longer this
        member's, or nothing of it came for ``timeout_ns`` (the shell calls this now and
        then; a chunk being written or a snapshot being installed is never dropped)."""
        transfer = self.transfer
        if transfer is None or self.writing or self.installing:
            self._seen = (self.heard, now_ns)
            return
        if self._seen[0] != self.heard:
            self._seen = (self.heard, now_ns)
        view = self.view
        if (
            transfer.leadership_term_id != view.leadership_term_id
            or transfer.leader_member_id != view.leader_member_id
            or now_ns - self._seen[1] >= timeout_ns
        ):
            self._drop()

    def take_dropped(self) -> list[Transfer]:
        """Transfers dropped: the shell removes their files."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def _drop(self) -> None:
        if self.transfer is not None and not (self.writing or self.installing):
            self._dropped.append(self.transfer)
            self.transfer, self.offset, self.complete = None, 0, None

    def take_writes(self) -> list[ChunkWrite]:
        """The chunks for the shell to write, in order."""
        writes, self._writes = self._writes, []
        return writes

    def on_written(self, transfer: Transfer, end: int) -> None:
        """The shell has written ``transfer``'s file durably up to ``end``."""
        if transfer != self.transfer:
            return
        self.writing = False
        self.offset = end
        if end == transfer.length:
            self.complete = transfer
            self.installing = True
        self._ack(transfer, end)

    def on_write_failed(self, transfer: Transfer, no_room: bool = False) -> None:
        """The chunk could not be written: the leader resends it; or, ``no_room`` (the
        disk filled up meanwhile), the transfer is dropped (its file removed, the space
        given back) and refused, as if it had not fit from the start."""
        if transfer == self.transfer:
            self.writing = False
            if no_room:
                self.refused = transfer
                self._drop()
                self._ack(transfer, 0, SNAPSHOT_NO_ROOM)

    def on_install_failed(self, transfer: Transfer) -> None:
        """The snapshot did not check out (or could not be installed): start over."""
        if transfer == self.transfer:
            self.transfer, self.offset, self.complete = None, 0, None
            self.installing = self.writing = False
            self._ack(transfer, 0)

    def finish(self) -> None:
        """The snapshot is installed: no transfer is under way."""
        self.transfer, self.offset, self.complete = None, 0, None
        self.installing = self.writing = False

    def _ack(self, transfer: Transfer, offset: int, flags: int = 0) -> None:
        self.consensus.send(
            transfer.leader_member_id,
            SnapshotChunkAck(
                leadership_term_id=transfer.leadership_term_id,
                follower_member_id=self.config.member_id,
                log_position=transfer.log_position,
                offset=offset,
                flags=flags,
            ),
        )

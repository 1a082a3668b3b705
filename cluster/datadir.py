"""Opening a member's data directory: locked for this process, its identity checked
and settled (:mod:`cluster.archive.identity`), then its stores (the recording log, the
archive, ``node-state.json``) opened, as :class:`DataDir`.

Nothing else opens the stores: a second process on the directory, or a directory of
another cluster or member, is refused before any file is touched
(:class:`~cluster.archive.identity.DataDirError`, exit code 2).
"""

from __future__ import annotations

from pathlib import Path

from .archive.compaction import reconcile
from .archive.identity import (
    DirectoryLock,
    Identity,
    check_identity,
    has_state,
    read_identity,
    settle_identity,
)
from .archive.node_state import NodeState
from .archive.recording_log import CM_SERVICE_ID, RecordingLog
from .archive.segments import Archive
from .archive.storage import NodeStorage
from .config import NodeConfig
from .fileio import make_directory


class DataDir:
    """A member's opened data directory; :meth:`close` releases it."""

    recording_log: RecordingLog
    archive: Archive
    node_state: NodeState
    identity: Identity
    storage: NodeStorage
    verified_from: int
    """Where start-up began checking the archive's records (the latest snapshot)."""

    def __init__(self, config: NodeConfig) -> None:
        self.path = Path(config.dir)
        make_directory(self.path)  # named durably in its parent: a power cut keeps it
        self.lock = DirectoryLock(self.path)  # first: one process per directory
        try:
            self._open(config)
        except BaseException:
            self.lock.release()
            raise

    def _open(self, config: NodeConfig) -> None:
        directory = self.path
        found = read_identity(directory)
        cluster_id = config.cluster_id
        if cluster_id < 0:  # not given: the directory's
            cluster_id = found.cluster_id if found is not None else 0
        if found is not None:
            check_identity(directory, found, cluster_id, config.member_id)
        had_state = has_state(directory)
        self.recording_log = RecordingLog.open(directory)
        latest = self.recording_log.get_latest_snapshot(CM_SERVICE_ID)
        self.verified_from = latest.log_position if latest is not None else 0
        self.archive = Archive.open(
            directory / "archive",
            segment_size=config.segment_size,
            fsync=config.fsync,
            verify_from=self.verified_from,
            start_position=reconcile(directory, self.recording_log),
        )
        self.node_state = NodeState(directory)
        self.identity = settle_identity(
            directory,
            found,
            Identity(
                cluster_id,
                config.member_id,
                voting=had_state or config.initial_cluster_state == "new",
            ),
            self.node_state,
            self.archive.position,
        )
        self.storage = NodeStorage(  # and its DiskHealth
            self.recording_log, self.node_state, identity=self.identity, directory=directory
        )

    def close(self) -> None:
        try:
            self.archive.close()
            self.recording_log.close()
        finally:
            self.lock.release()

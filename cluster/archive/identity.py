"""A data directory's identity and its lock: which cluster and member it belongs to,
whether its state may vote, and which process holds it.

``member.json`` records the cluster id and member id the directory was made for, and
``voting``: whether the member's durable state may count toward a quorum.  A directory
made new (a first start, a replaced disk) does not vote: the member joins as a
*catch-up* member and votes again only once a leader elected by others has brought it
to that leader's commit position (:mod:`cluster.core.election` says how a brand-new
cluster, where every member is new, starts all the same).  A directory whose durable
state is behind what it once acknowledged (its ``node-state.json`` gone, or a log that
ends before the commit position it saved) is demoted the same way.

``member.lock`` is held (``flock``, exclusive) for the life of the process that opened
the directory, and names its pid: a second process on the same directory is refused.
The kernel drops the lock when the process dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..fileio import read_regular, replace_file
from . import node_state, recording_log

log = logging.getLogger("cluster.node")

IDENTITY_FILE = "member.json"
LOCK_FILE = "member.lock"
MAX_FILE = 1 << 20
"""The most ``member.json`` is read for (it is a few dozen bytes)."""


class DataDirError(Exception):
    """The directory cannot be used by this member (another cluster's or member's, held
    by a live process, unreadable): the node does not start (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Identity:
    cluster_id: int
    member_id: int
    voting: bool


class DirectoryLock:
    """An exclusive lock on a data directory, held until :meth:`release`."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise DataDirError(f"cannot lock data directory {directory}: {exc}") from None
            raise DataDirError(
                f"data directory {directory} is in use by another process"
                + (f" (pid {holder})" if holder else "")
                + ": one member per directory"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is for the message above only; the lock is what counts
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def holder_pid(directory: Path) -> int | None:
    """The pid of the process holding ``directory`` (0 if the holder wrote none), or
    None when no process holds it.  Read-only: it asks for a shared lock, which it gets
    (and drops at once) only when nobody holds the exclusive one; raises
    :class:`DataDirError` when the directory has no lock file (it is no member's)."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DataDirError(f"{directory} is no member's data directory (no {LOCK_FILE})") from None
    except OSError as exc:
        raise DataDirError(f"cannot read {path}: {exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise DataDirError(f"cannot lock-test {path}: {exc}") from None
            return _read_pid(fd) or 0
        return None  # nobody holds it (closing the descriptor drops our shared lock)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def read_identity(directory: Path) -> Identity | None:
    """The directory's recorded identity (None: the file is not there)."""
    path = directory / IDENTITY_FILE
    try:
        data = json.loads(read_regular(path, MAX_FILE))
        return Identity(int(data["cluster_id"]), int(data["member_id"]), bool(data["voting"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataDirError(f"unreadable {path}: {exc}") from None


def write_identity(directory: Path, identity: Identity) -> None:
    """Record ``identity`` durably (a temporary file, fsynced and renamed); ``OSError``
    (a full disk) leaves the old one."""
    data = json.dumps(
        {
            "cluster_id": identity.cluster_id,
            "member_id": identity.member_id,
            "voting": identity.voting,
        }
    ).encode()
    replace_file(directory / IDENTITY_FILE, data)


def check_identity(directory: Path, found: Identity, cluster_id: int, member_id: int) -> None:
    """Refuse a directory made for another cluster or member."""
    if found.member_id != member_id:
        raise DataDirError(
            f"data directory {directory} belongs to member {found.member_id}, not member "
            f"{member_id}: give each member its own --dir"
        )
    if found.cluster_id != cluster_id:
        raise DataDirError(
            f"data directory {directory} belongs to cluster {found.cluster_id}, not "
            f"cluster {cluster_id} (--cluster-id)"
        )


def has_state(directory: Path) -> bool:
    """Whether ``directory`` holds a member's state from an earlier start (before it is
    opened, which makes the files)."""
    if (directory / node_state.FILE_NAME).exists():
        return True
    if (directory / recording_log.FILE_NAME).exists():
        return True
    archive = directory / "archive"
    return archive.is_dir() and any(archive.glob("log-*.seg"))


def settle_identity(
    directory: Path,
    found: Identity | None,
    new: Identity,
    state: node_state.NodeState,
    archive_end: int,
) -> Identity:
    """The identity this start runs with, recorded before the member acts on it.

    ``found`` is what the directory recorded (None: nothing); ``new`` what to record
    otherwise (voting if the directory held state from before this identity file
    existed).  A voting directory whose state is behind what it acknowledged is demoted:
    ``node-state.json`` missing, or a log ending before the commit position it saved."""
    identity = found or new
    lost = ""
    if found is not None and found.voting:
        if not state.path.exists():
            lost = f"its {node_state.FILE_NAME} is missing"
        elif archive_end < state.commit_position:
            lost = (
                f"its log ends at {archive_end}, before the commit position it saved "
                f"({state.commit_position})"
            )
    if lost:
        log.warning(
            "data directory %s: %s; member %d joins as a catch-up member (it votes again "
            "once a leader has caught it up)",
            directory,
            lost,
            found.member_id if found is not None else new.member_id,
        )
        identity = Identity(identity.cluster_id, identity.member_id, voting=False)
    if found is None and not state.path.exists():
        state.save()  # a voting directory always has one (its absence means lost state)
    if identity != found:
        write_identity(directory, identity)
    if not identity.voting and not lost:
        log.info(
            "member %d's data directory %s is new or lost its state: it is a catch-up "
            "member, votes for nobody and counts toward no quorum until a leader elected "
            "by others has brought it up to date (a brand-new cluster starts once every "
            "member answers with an empty log)",
            identity.member_id,
            directory,
        )
    return identity

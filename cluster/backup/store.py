"""A backup directory being written: the same layout ``cluster-tool backup --from-dir``
makes and ``cluster-tool restore`` reads (:mod:`cluster.tool.backup`).

``DIR/snapshots/snapshot-<position>-<term>.snap`` (each written to a temporary file,
checked, renamed), ``DIR/archive/log-<base>.seg`` (the committed log, in the backup's own
segments: a new one at a record's start once the last holds ``segment_size`` bytes, so
that retention can drop whole files), ``DIR/recording.log`` (the terms, a ``LOG_START``
where the backup's log begins, the snapshots it holds) and ``DIR/backup.json`` (the
manifest: the position the backup **covers**, its snapshots, its log).  The recording log
and then the manifest are replaced atomically (temporary file, fsync, rename) after the
files they name are durable, so a restore finds a consistent backup at any time; what
was appended past the manifest's ``log_end`` (a backup stopped half-way) is cut off when
the directory is opened again, and the backup goes on from there.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..archive.reader import list_segments, segment_name
from ..archive.record import RECORD_HEADER, RECORD_HEADER_LENGTH, complete_length
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from ..archive.segments import DEFAULT_SEGMENT_SIZE
from ..archive.snapshots import snapshot_path
from ..fileio import fsync_directory, make_directory, replace_file, write_all
from .manifest import FORMAT, KIND_CONTINUOUS, KIND_LIVE, MANIFEST, ManifestError, read_manifest

_PARTS = ("archive", "archive.new", "archive.old", "snapshots")


class StoreError(Exception):
    """The directory cannot hold this backup (the reason in words)."""


class NotContinuous(StoreError):
    """The directory holds something ``cluster-backup`` must not go on with: another
    program's backup, or files that are no backup."""


class BackupStore:
    """One backup directory (see the module docstring)."""

    def __init__(self, out: Path, manifest: dict[str, Any], segment_size: int) -> None:
        self.out = out
        self.manifest = manifest
        self.segment_size = segment_size
        self._fd: int | None = None
        self._segment_base = -1
        self.records = 0
        """Records appended (each CRC-checked on the way) since this store was opened."""
        self.appended_bytes = 0
        self._doomed: list[Path] = []
        self._archive = out / "archive"
        """Where the log is written: ``archive``, or ``archive.new`` while a log begun
        afresh (:meth:`start_at`) is not committed yet."""
        """Files dropped by retention, deleted once the manifest no longer names them."""

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(
        cls, out: Path, segment_size: int = DEFAULT_SEGMENT_SIZE, kind: str = KIND_LIVE
    ) -> BackupStore:
        """A new backup in ``out``, which must be new or empty (a one-shot backup)."""
        if out.exists() and any(out.iterdir()):
            raise StoreError(f"{out} is not empty: a backup goes to a new directory")
        return cls._fresh(out, segment_size, kind)

    @classmethod
    def _fresh(cls, out: Path, segment_size: int, kind: str) -> BackupStore:
        """Nothing is written until the first log (:meth:`start_at`): a backup that
        never gets that far leaves no empty folders behind."""
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "kind": kind,
            "new_cluster_id": random.randrange(1, 1 << 31),
            "created": time.time(),
            "snapshot": None,
            "snapshots": [],
            "terms": [],
            "log_start": None,
            "log_end": None,
            "covers": 0,
        }
        return cls(out, manifest, segment_size)

    @classmethod
    def open(cls, out: Path, segment_size: int = DEFAULT_SEGMENT_SIZE) -> BackupStore:
        """The continuous backup in ``out`` to go on with (a new one if ``out`` is new
        or empty): what lies past its manifest is removed.  :class:`NotContinuous` for
        a one-shot backup (``cluster-tool backup``): extended, it would no longer be
        the backup of the moment it was taken, and its retention would drop what it
        held."""
        path = out / MANIFEST
        if not os.path.lexists(path):
            if out.exists() and any(p.name not in _PARTS for p in out.iterdir()):
                raise NotContinuous(
                    f"{out} holds files but no {MANIFEST}: it is no backup; give "
                    "cluster-backup a new --out (or the folder of a backup it made)"
                )
            return cls._fresh(out, segment_size, KIND_CONTINUOUS)
        try:
            manifest, _data = read_manifest(out)
        except ManifestError as exc:
            raise StoreError(str(exc)) from None
        kind = manifest.get("kind")
        if "snapshots" not in manifest or kind not in (None, KIND_CONTINUOUS):
            made = ("`cluster-tool backup --out`" if kind == KIND_LIVE
                    else "`cluster-tool backup --from-dir`")  # fmt: skip
            raise NotContinuous(
                f"{out} is a one-shot backup (made by {made}), not one cluster-backup "
                "made: going on with it would change what it holds; keep it as it is "
                "and give cluster-backup a new --out"
            )
        manifest["kind"] = KIND_CONTINUOUS  # one made before backups said their kind
        store = cls(out, manifest, segment_size)
        store._reconcile()
        return store

    def _reconcile(self) -> None:
        """Cut what was written after the manifest (a stop half-way), and finish or undo
        a log begun afresh that a stop cut short (see :meth:`commit`)."""
        start, end = self.log_start, self.log_end
        archive, staging, old = (self.out / n for n in ("archive", "archive.new", "archive.old"))
        shutil.rmtree(staging, ignore_errors=True)  # never swapped in: the manifest is older
        if old.exists():
            if archive.exists():
                first = list_segments(archive)
                if first and first[0].base == start:  # the manifest names the new log
                    shutil.rmtree(old)
                else:
                    shutil.rmtree(archive)
            if not archive.exists():
                os.rename(old, archive)
        archive.mkdir(exist_ok=True)
        (self.out / "snapshots").mkdir(exist_ok=True)
        for segment in list_segments(archive):
            if (
                start is None
                or end is None
                or segment.base < start
                or (segment.base >= end and segment.base != start)
            ):
                segment.path.unlink()
            elif segment.end > end:
                os.truncate(segment.path, end - segment.base)
        kept = {self._snapshot_file(e).name for e in self.manifest["snapshots"]}
        for file in (self.out / "snapshots").iterdir():
            if file.name not in kept:
                file.unlink()

    # ------------------------------------------------------------------ state

    @property
    def log_start(self) -> int | None:
        value = self.manifest["log_start"]
        return None if value is None else int(value)

    @property
    def log_end(self) -> int | None:
        value = self.manifest["log_end"]
        return None if value is None else int(value)

    @property
    def snapshots(self) -> list[dict[str, Any]]:
        """The consensus module's snapshot entries held, oldest first."""
        return [e for e in self.manifest["snapshots"] if e["service_id"] == CM_SERVICE_ID]

    @property
    def latest_snapshot(self) -> int:
        """The newest held snapshot's log position (-1: none)."""
        return max((int(e["log_position"]) for e in self.snapshots), default=-1)

    def _snapshot_file(self, entry: dict[str, Any]) -> Path:
        return snapshot_path(self.out, entry["log_position"], entry["leadership_term_id"])

    # ------------------------------------------------------------------ writing

    def snapshot_temp(self) -> Path:
        make_directory(self.out / "snapshots")  # the backup's folder too: durably
        return self.out / "snapshots" / "incoming.tmp"

    def add_snapshot(self, entries: list[dict[str, Any]], checked: Path) -> None:
        """Take the snapshot file ``checked`` (written whole and checked) with its
        recording-log ``entries`` (the service's and the consensus module's)."""
        target = self._snapshot_file(entries[0])
        fd = os.open(checked, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(checked, target)
        fsync_directory(target.parent)
        known = {(e["log_position"], e["service_id"]) for e in self.manifest["snapshots"]}
        for entry in entries:
            if (entry["log_position"], entry["service_id"]) not in known:
                self.manifest["snapshots"].append(
                    {k: entry[k] for k in ("leadership_term_id", "term_base_log_position",
                                           "log_position", "timestamp", "service_id")}
                )  # fmt: skip
        self.manifest["snapshots"].sort(key=lambda e: (e["log_position"], -e["service_id"]))

    def start_at(self, position: int) -> None:
        """Begin the backup's log, empty, at ``position`` (a snapshot's): every log and
        snapshot below it is dropped.  The new log is written beside the old one
        (``archive.new``) and takes its place at the next :meth:`commit`, so the
        directory stays a whole backup meanwhile."""
        self._close_segment()
        staging = self.out / "archive.new"
        shutil.rmtree(staging, ignore_errors=True)
        make_directory(self.out)  # named durably in its parent: a power cut keeps it
        staging.mkdir()
        self._archive = staging
        self.manifest["snapshots"] = [
            e for e in self.manifest["snapshots"] if e["log_position"] >= position
        ]
        self.manifest["log_start"] = self.manifest["log_end"] = position
        self._new_segment(position)
        kept = {self._snapshot_file(e) for e in self.manifest["snapshots"]}
        self._doomed += [f for f in (self.out / "snapshots").glob("*.snap") if f not in kept]

    def _new_segment(self, base: int) -> None:
        self._close_segment()
        path = self._archive / segment_name(base)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._segment_base = base
        fsync_directory(path.parent)

    def _close_segment(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.fsync(fd)
            os.close(fd)

    def append(self, data: bytes) -> None:
        """Append whole, checked records at :attr:`log_end` (in the manifest at the next
        :meth:`commit`), in a new segment at the first record's start past
        ``segment_size``."""
        if self.log_end is None:
            raise StoreError("the backup's log has no start yet")
        if self._fd is None:
            last = list_segments(self._archive)[-1]
            self._fd = os.open(last.path, os.O_WRONLY)
            self._segment_base = last.base
        view = memoryview(data)
        while view.nbytes:
            end = self.log_end
            room = self._segment_base + self.segment_size - end
            if room <= 0:
                self._new_segment(end)
                room = self.segment_size
            size = view.nbytes if view.nbytes <= room else max(complete_length(view[:room]), 0)
            if size == 0:  # one record longer than the room left: it goes whole
                length, _crc = RECORD_HEADER.unpack_from(view)
                size = RECORD_HEADER_LENGTH + length
            assert self._fd is not None
            write_all(self._fd, view[:size], end - self._segment_base)
            self.manifest["log_end"] = end + size
            self.appended_bytes += size
            view = view[size:]
            if view.nbytes:
                self._new_segment(self.log_end)

    def retain(self, keep: int) -> None:
        """Keep the newest ``keep`` snapshots and the log from the oldest of them (whole
        segment files: the log may begin a little below it).  The files are deleted by
        the next :meth:`commit`, once the recording log and the manifest no longer name
        them, so a restore meanwhile finds the old consistent set."""
        snaps = self.snapshots
        if keep <= 0 or len(snaps) <= keep:
            return
        oldest = int(snaps[-keep]["log_position"])
        self.manifest["snapshots"] = [
            e for e in self.manifest["snapshots"] if e["log_position"] >= oldest
        ]
        segments = list_segments(self._archive)
        doomed = [s for s in segments[:-1] if s.end <= oldest]
        self._doomed += [s.path for s in doomed]
        self.manifest["log_start"] = segments[len(doomed)].base
        kept = {self._snapshot_file(e) for e in self.manifest["snapshots"]}
        self._doomed += [f for f in (self.out / "snapshots").glob("*.snap") if f not in kept]

    # ------------------------------------------------------------------ the manifest

    def set_terms(self, terms: list[dict[str, Any]]) -> None:
        """Merge a member's recording-log terms into the backup's (the newest word on
        each term wins)."""
        by_id = {int(t["leadership_term_id"]): t for t in self.manifest["terms"]}
        for term in terms:
            by_id[int(term["leadership_term_id"])] = {
                k: term[k] for k in ("leadership_term_id", "term_base_log_position", "timestamp")
            }
        self.manifest["terms"] = [by_id[k] for k in sorted(by_id)]

    def _recording_log(self) -> bytes:
        end = self.log_end or 0
        start = self.log_start or 0
        terms = [t for t in self.manifest["terms"] if t["term_base_log_position"] <= end]
        with tempfile.TemporaryDirectory(dir=self.out, prefix=".recording-") as tmp:
            with RecordingLog.open(tmp) as log:
                for term in terms:
                    try:
                        log.append_term(
                            term["leadership_term_id"],
                            term["term_base_log_position"],
                            term["timestamp"],
                        )
                    except ValueError:
                        continue  # a term that another member's view contradicts
                if start > 0:
                    holder = max(
                        (t for t in terms if t["term_base_log_position"] <= start),
                        key=lambda t: t["leadership_term_id"],
                        default=None,
                    )
                    log.append_log_start(
                        start,
                        -1 if holder is None else holder["leadership_term_id"],
                        0 if holder is None else holder["term_base_log_position"],
                        int(time.time() * 1000),
                    )
                for entry in self.manifest["snapshots"]:
                    if entry["log_position"] <= end:
                        log.append_snapshot(
                            entry["leadership_term_id"],
                            entry["term_base_log_position"],
                            entry["log_position"],
                            entry["timestamp"],
                            entry["service_id"],
                        )
            return (Path(tmp) / "recording.log").read_bytes()

    def commit(self, **source: Any) -> dict[str, Any]:
        """Make everything written durable, then the recording log and the manifest
        (``source``: who it came from, merged into the manifest); the manifest."""
        if self._fd is not None:
            os.fsync(self._fd)
        fsync_directory(self._archive)
        archive, old = self.out / "archive", self.out / "archive.old"
        if self._archive != archive:  # a log begun afresh: it takes the old one's place
            shutil.rmtree(old, ignore_errors=True)
            if archive.exists():  # none yet: the backup's first log
                os.rename(archive, old)
            os.rename(self._archive, archive)
            fsync_directory(self.out)
            self._archive = archive
        end = self.log_end or 0
        manifest = self.manifest
        manifest.update(source)
        held = [e for e in self.snapshots if e["log_position"] <= end]
        latest = max(held, key=lambda e: e["log_position"], default=None)
        manifest["snapshot"] = latest and {
            "log_position": latest["log_position"],
            "leadership_term_id": latest["leadership_term_id"],
        }
        manifest["covers"] = end
        manifest["updated"] = time.time()
        replace_file(self.out / "recording.log", self._recording_log())
        replace_file(self.out / MANIFEST, json.dumps(manifest, indent=2).encode())
        doomed, self._doomed = self._doomed, []
        for path in doomed:  # named by neither any more (see retain)
            path.unlink(missing_ok=True)
        shutil.rmtree(old, ignore_errors=True)
        return manifest

    def close(self) -> None:
        self._close_segment()

    def remove(self) -> None:
        """Remove the whole directory (a one-shot backup that failed)."""
        self.close()
        shutil.rmtree(self.out, ignore_errors=True)

"""Reading members' archives: discovery on the driver, a PySpark data source on executors.

The driver only lists files: :func:`discover_members` finds each member's segment files
(``archive/log-<base>.seg``), its saved commit position (``node-state.json``) and its
recording log, and :func:`plan_partitions` turns the segments into one
:class:`SegmentPartition` each.  The data source :class:`ArchiveDataSource`
(``spark.read.format("triarch_archive")``) reads every partition on an executor with
:func:`read_segment`: the project's record scanner (:mod:`cluster.archive.reader`,
CRC-checked, chunked) and log codec (:data:`cluster.protocol.codec.LOG`), yielding Arrow
record batches of :data:`BATCH_ROWS` rows.  No log bytes go through the driver.

A record that fails its checks (bad length or CRC, an incomplete record where the file
ends, a CRC-valid body that does not decode) does not raise on the executor: the reader
emits a *problem row* (``type == PROBLEM``) naming the position and the reason and stops
reading that segment (or skips the one undecodable record, whose framing is intact).
The job collects those rows and either fails with all of them listed or, with
``--skip-corrupt``, leaves them out of the tables and lists them in the report.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..archive.errors import ArchiveCorruptionError
from ..archive.node_state import FILE_NAME as NODE_STATE_FILE
from ..archive.node_state import NodeState
from ..archive.reader import BadRecord, scan_records
from ..archive.record import RECORD_HEADER_LENGTH
from ..archive.recording_log import ENTRY_TYPE_TERM, RecordingLog
from ..archive.recording_log import FILE_NAME as RECORDING_LOG_FILE
from ..protocol.codec import LOG
from ..protocol.errors import ProtocolError
from ..protocol.ingress import SessionMessageHeader
from ..protocol.log import (
    ClusterActionRequest,
    MembershipChangeEvent,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "BATCH_ROWS",
    "FORMAT",
    "PROBLEM",
    "SCHEMA",
    "ArchiveDataSource",
    "MemberArchive",
    "PipelineInputError",
    "Problem",
    "SegmentPartition",
    "TermRecord",
    "discover_members",
    "plan_partitions",
    "read_segment",
]

FORMAT = "triarch_archive"
"""The data source's short name: ``spark.read.format(FORMAT)``."""
PROBLEM = "PROBLEM"
"""``type`` of a problem row: ``position`` = where, ``length`` = bytes skipped, ``detail``."""
BATCH_ROWS = 65536
"""Rows per Arrow record batch."""

SCHEMA = (
    "member STRING, position BIGINT, length INT, crc BIGINT, term BIGINT, type STRING, "
    "cluster_session_id BIGINT, timestamp BIGINT, payload_size INT, correlation_id BIGINT, "
    "close_reason STRING, action STRING, leader_member_id INT, base_position BIGINT, "
    "segment STRING, detail STRING"
)
"""Columns of the scan (Spark DDL); see the README for their meaning."""

_SEGMENT_NAME = re.compile(r"log-(\d{20})\.seg")


class PipelineInputError(Exception):
    """The archives given cannot be read at all (no segments, not a directory...)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Damage found in a member's files: ``position`` is a log position (segments) or a
    byte offset (``recording.log``); ``skipped_bytes`` how much could not be read."""

    member: str
    file: str
    position: int
    reason: str
    skipped_bytes: int
    from_segment_data: bool = False
    """Found by a reader in the records (not by the driver in the file listing)."""

    def describe(self) -> str:
        return f"{self.file}: position {self.position}: {self.reason}"


@dataclass(frozen=True, slots=True)
class TermRecord:
    """A valid TERM entry of a member's ``recording.log``."""

    term: int
    base_position: int
    log_position: int
    timestamp: int


@dataclass(slots=True)
class MemberArchive:
    """One member's files, as found on the driver (no log bytes read)."""

    name: str
    directory: Path
    """The member's data directory (``node-state.json``, ``recording.log``)."""
    archive_dir: Path
    """The directory of its segment files."""
    segments: list[tuple[int, Path, int]] = field(default_factory=list)
    """``(base position, path, size)`` in log order."""
    commit_position: int = 0
    """Saved in ``node-state.json``: a lower bound of the commit position (0 if absent)."""
    has_node_state: bool = False
    terms: list[TermRecord] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    """Found on the driver: gaps between segments, a damaged recording log."""

    @property
    def start_position(self) -> int:
        return self.segments[0][0] if self.segments else 0

    @property
    def end_position(self) -> int:
        """End of the log as the file sizes say (the position after the last byte)."""
        if not self.segments:
            return 0
        base, _, size = self.segments[-1]
        return base + size

    def describe(self) -> dict[str, Any]:
        return {
            "member": self.name,
            "directory": str(self.directory),
            "archive": str(self.archive_dir),
            "segments": len(self.segments),
            "start_position": self.start_position,
            "end_position": self.end_position,
            "commit_position": self.commit_position,
            "node_state": self.has_node_state,
            "recording_log_terms": [asdict(t) for t in self.terms],
        }


# ---------------------------------------------------------------------- driver side


def _is_member_dir(path: Path) -> bool:
    return (path / "archive").is_dir()


def _has_segments(path: Path) -> bool:
    return any(_SEGMENT_NAME.fullmatch(p.name) for p in path.iterdir())


def _resolve(path: Path) -> list[tuple[Path, Path]]:
    """``(member dir, archive dir)`` pairs for one ``--archives`` argument."""
    if not path.is_dir():
        raise PipelineInputError(f"{path}: not a directory")
    if _is_member_dir(path):
        return [(path, path / "archive")]
    if _has_segments(path):
        parent = path.parent
        owner = parent if (parent / NODE_STATE_FILE).exists() else path
        return [(owner, path)]
    members = sorted(p for p in path.iterdir() if p.is_dir() and _is_member_dir(p))
    if members:
        return [(m, m / "archive") for m in members]
    raise PipelineInputError(
        f"{path}: no archive found (expected a member directory with archive/log-*.seg, "
        "a directory of log-*.seg files, or a directory of member directories)"
    )


def _list_segments(member: MemberArchive) -> None:
    """Fill ``member.segments``; a segment that does not start where the previous one ends
    is a problem (a truncated or missing segment file)."""
    found = []
    for entry in os.scandir(member.archive_dir):
        match = _SEGMENT_NAME.fullmatch(entry.name)
        if match is not None and entry.is_file(follow_symlinks=False):
            found.append((int(match.group(1)), Path(entry.path), entry.stat().st_size))
    found.sort()
    for previous, current in itertools.pairwise(found):
        end = previous[0] + previous[2]
        if end != current[0]:
            why = (
                f"segment {previous[1].name} ends at log position {end} but the next one, "
                f"{current[1].name}, starts at {current[0]}"
            )
            if end < current[0]:
                why += ": the segment file is truncated or a segment is missing"
            else:
                why += ": segments overlap"
            member.problems.append(
                Problem(member.name, str(previous[1]), end, why, max(0, current[0] - end))
            )
    member.segments = found


def _read_terms(member: MemberArchive) -> None:
    """Valid TERM entries of ``recording.log``, read from a copy (opening a recording log
    repairs a torn last entry in place, and the archives here are read-only)."""
    source = member.directory / RECORDING_LOG_FILE
    if not source.is_file():
        return
    with tempfile.TemporaryDirectory(prefix="triarch-recording-log-") as tmp:
        shutil.copyfile(source, Path(tmp) / RECORDING_LOG_FILE)
        try:
            with RecordingLog.open(tmp) as recording_log:
                entries = recording_log.entries
        except ArchiveCorruptionError as exc:
            member.problems.append(
                Problem(member.name, str(source), exc.position, f"recording log: {exc.reason}", 0)
            )
            return
    member.terms = [
        TermRecord(e.leadership_term_id, e.term_base_log_position, e.log_position, e.timestamp)
        for e in entries
        if e.is_valid and e.type == ENTRY_TYPE_TERM
    ]


def discover_members(paths: Sequence[str | os.PathLike[str]]) -> list[MemberArchive]:
    """The members whose archives are in ``paths`` (member directories, archive directories
    or directories of member directories), named after their directories.

    Raises:
        PipelineInputError: a path holds no archive, or ``node-state.json`` is unreadable.
    """
    pairs: list[tuple[Path, Path]] = []
    for raw in paths:
        for pair in _resolve(Path(raw).resolve()):
            if pair not in pairs:
                pairs.append(pair)
    members: list[MemberArchive] = []
    names: set[str] = set()
    for directory, archive_dir in pairs:
        name = directory.name or str(directory)
        if name in names:
            name = f"{directory.parent.name}/{name}"
        suffix = 2
        base_name = name
        while name in names:
            name = f"{base_name}#{suffix}"
            suffix += 1
        names.add(name)
        member = MemberArchive(name, directory, archive_dir)
        _list_segments(member)
        if (directory / NODE_STATE_FILE).is_file():
            try:
                member.commit_position = NodeState(directory).commit_position
            except ArchiveCorruptionError as exc:
                raise PipelineInputError(str(exc)) from None
            member.has_node_state = True
        _read_terms(member)
        members.append(member)
    return members


@dataclass
class SegmentPartition(InputPartition):
    """One segment file of one member: log bytes ``[base, base + length)``."""

    member: str
    path: str
    base: int
    length: int


def plan_partitions(
    members: Sequence[MemberArchive], only: set[tuple[str, str]] | None = None
) -> str:
    """The partitions of every member's segments (or of the ``(member, segment file
    name)`` pairs in ``only``), as the data source's ``plan`` option.

    Largest segments first, so that the long tasks start early."""
    parts = [
        {"member": m.name, "path": str(path), "base": base, "length": size}
        for m in members
        for base, path, size in m.segments
        if size > 0 and (only is None or (m.name, path.name) in only)
    ]
    parts.sort(key=lambda p: -int(str(p["length"])))
    return json.dumps(parts)


# ---------------------------------------------------------------------- executor side


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("member", pa.string()),
            ("position", pa.int64()),
            ("length", pa.int32()),
            ("crc", pa.int64()),
            ("term", pa.int64()),
            ("type", pa.string()),
            ("cluster_session_id", pa.int64()),
            ("timestamp", pa.int64()),
            ("payload_size", pa.int32()),
            ("correlation_id", pa.int64()),
            ("close_reason", pa.string()),
            ("action", pa.string()),
            ("leader_member_id", pa.int32()),
            ("base_position", pa.int64()),
            ("segment", pa.string()),
            ("detail", pa.string()),
        ]
    )


class _Batch:
    """The rows of one Arrow batch being read.

    Dense columns are lists; the columns that only some log messages have (and the
    problem detail) are kept as ``(row, values)`` pairs and filled in when the batch is
    built, which keeps the loop over client messages short."""

    __slots__ = (
        "crc",
        "extras",
        "length",
        "payload_size",
        "position",
        "session",
        "term",
        "timestamp",
        "type",
    )

    def __init__(self) -> None:
        self.position: list[int] = []
        self.length: list[int] = []
        self.crc: list[int] = []
        self.term: list[int | None] = []
        self.type: list[str] = []
        self.session: list[int | None] = []
        self.timestamp: list[int | None] = []
        self.payload_size: list[int | None] = []
        self.extras: list[tuple[int, tuple[Any, ...]]] = []
        """``(row, (correlation_id, close_reason, action, leader_member_id,
        base_position, detail))``."""

    def __len__(self) -> int:
        return len(self.position)

    def problem(self, position: int, skipped: int, reason: str) -> None:
        self.extras.append((len(self.position), (None, None, None, None, None, reason)))
        self.position.append(position)
        self.length.append(skipped)
        self.crc.append(0)
        self.term.append(None)
        self.type.append(PROBLEM)
        self.session.append(None)
        self.timestamp.append(None)
        self.payload_size.append(None)

    def event(self, position: int, body: memoryview, message: object) -> None:
        """A log message other than a SessionMessageHeader."""
        session: int | None = None
        payload_size: int | None = None
        correlation: int | None = None
        close_reason: str | None = None
        action: str | None = None
        leader: int | None = None
        base_position: int | None = None
        if isinstance(message, SessionOpenEvent):
            session, correlation = message.cluster_session_id, message.correlation_id
            payload_size = len(message.encoded_principal)
        elif isinstance(message, SessionCloseEvent):
            session = message.cluster_session_id
            close_reason = message.close_reason.name
        elif isinstance(message, TimerEvent):
            correlation = message.correlation_id
        elif isinstance(message, NewLeadershipTermEvent):
            leader, base_position = message.leader_member_id, message.term_base_log_position
        elif isinstance(message, ClusterActionRequest):
            action = message.action.name
        elif isinstance(message, MembershipChangeEvent):
            leader = message.leader_member_id
            action = message.change_type.name
        row = len(self.position)
        self.extras.append((row, (correlation, close_reason, action, leader, base_position, None)))
        self.position.append(position)
        self.length.append(len(body))
        self.crc.append(zlib.crc32(body))
        self.term.append(getattr(message, "leadership_term_id", None))
        self.type.append(type(message).__name__)
        self.session.append(session)
        self.timestamp.append(getattr(message, "timestamp", None))
        self.payload_size.append(payload_size)

    def build(self, schema: pa.Schema, member: str, segment: str) -> pa.RecordBatch:
        import pyarrow as pa

        n = len(self.position)
        sparse: list[list[Any]] = [[None] * n for _ in range(6)]
        for row, values in self.extras:
            for column, value in zip(sparse, values, strict=True):
                column[row] = value
        correlation, close_reason, action, leader, base_position, detail = sparse
        return pa.RecordBatch.from_arrays(
            [
                pa.array([member] * n, pa.string()),
                pa.array(self.position, pa.int64()),
                pa.array(self.length, pa.int32()),
                pa.array(self.crc, pa.int64()),
                pa.array(self.term, pa.int64()),
                pa.array(self.type, pa.string()),
                pa.array(self.session, pa.int64()),
                pa.array(self.timestamp, pa.int64()),
                pa.array(self.payload_size, pa.int32()),
                pa.array(correlation, pa.int64()),
                pa.array(close_reason, pa.string()),
                pa.array(action, pa.string()),
                pa.array(leader, pa.int32()),
                pa.array(base_position, pa.int64()),
                pa.array([segment] * n, pa.string()),
                pa.array(detail, pa.string()),
            ],
            schema=schema,
        )


class _Records:
    """Iterates over the scanner's records and keeps what it returned at the end."""

    def __init__(self, scan: Generator[tuple[int, memoryview], None, BadRecord | None]) -> None:
        self.bad: BadRecord | None = None
        self._iterator = self._run(scan)

    def _run(
        self, scan: Generator[tuple[int, memoryview], None, BadRecord | None]
    ) -> Iterator[tuple[int, memoryview]]:
        self.bad = yield from scan

    def __iter__(self) -> Iterator[tuple[int, memoryview]]:
        return self._iterator


def _describe_bad(
    path: str, base: int, offset: int, reason: str, length: int | None, size: int
) -> str:
    position = base + offset
    if reason == "incomplete record":
        if length is None:
            what = f"only {size - offset} bytes left, less than a record header"
        else:
            what = (
                f"the record needs {RECORD_HEADER_LENGTH + length} bytes, "
                f"only {size - offset} are left"
            )
        return (
            f"{path}: truncated at log position {position} (file offset {offset}): {what} "
            "(a torn write if the member crashed: restarting the member truncates it)"
        )
    return f"{path}: corrupt record at log position {position} (file offset {offset}): {reason}"


def read_segment(member: str, path: str, base: int, length: int) -> Iterator[pa.RecordBatch]:
    """Decode the records of one segment file into Arrow batches (see :data:`SCHEMA`).

    Reads ``length`` bytes (the size seen when planning; a node may still be appending).
    Damage gives a problem row instead of an exception; reading stops at it.
    """
    schema = _arrow_schema()
    segment = os.path.basename(path)
    decode = LOG.decode
    crc32 = zlib.crc32
    message_type = "SessionMessageHeader"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        failed = _Batch()
        failed.problem(base, length, f"{path}: cannot open: {exc.strerror or exc}")
        yield failed.build(schema, member, segment)
        return
    try:
        size = min(length, os.fstat(fd).st_size)
        records = _Records(scan_records(fd, 0, size, base))
        iterator = iter(records)
        done = False
        while not done:
            batch = _Batch()
            add_position = batch.position.append
            add_length = batch.length.append
            add_crc = batch.crc.append
            add_term = batch.term.append
            add_type = batch.type.append
            add_session = batch.session.append
            add_timestamp = batch.timestamp.append
            add_payload = batch.payload_size.append
            done = True
            for position, body in iterator:
                try:
                    message = decode(body)
                except ProtocolError as exc:
                    batch.problem(
                        position,
                        RECORD_HEADER_LENGTH + len(body),
                        f"{path}: undecodable log message at log position {position} "
                        f"(file offset {position - base}): {exc}",
                    )
                else:
                    if isinstance(message, SessionMessageHeader):
                        add_position(position)
                        add_length(len(body))
                        add_crc(crc32(body))
                        add_term(message.leadership_term_id)
                        add_type(message_type)
                        add_session(message.cluster_session_id)
                        add_timestamp(message.timestamp)
                        add_payload(len(message.payload))
                    else:
                        batch.event(position, body, message)
                if len(batch.position) >= BATCH_ROWS:
                    done = False
                    break
            if done:
                bad = records.bad
                if bad is not None:
                    reason = _describe_bad(path, base, bad.offset, bad.reason, bad.length, size)
                    batch.problem(base + bad.offset, size - bad.offset, reason)
                elif size < length:
                    batch.problem(
                        base + size,
                        length - size,
                        f"{path}: the file shrank to {size} bytes while it was read "
                        f"(it was {length})",
                    )
            if len(batch):
                yield batch.build(schema, member, segment)
    finally:
        os.close(fd)


class _ArchiveReader(DataSourceReader):
    def __init__(self, plan: str) -> None:
        self.plan = plan

    def partitions(self) -> Sequence[InputPartition]:
        return [SegmentPartition(**p) for p in json.loads(self.plan)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPartition)
        return read_segment(partition.member, partition.path, partition.base, partition.length)


class ArchiveDataSource(DataSource):
    """``spark.read.format("triarch_archive").option("plan", plan_partitions(...)).load()``:
    one partition per segment file, read lazily on the executors."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        plan = self.options.get("plan")
        if plan is None:
            raise ValueError(f"the {FORMAT} data source needs the 'plan' option")
        return _ArchiveReader(str(plan))

"""Reading members' archives: discovery on the driver, decoding on the executors.

The driver only lists files, through the Spark session's Hadoop file system
(:class:`~cluster.pipeline.fs.HadoopFS`, so an archive may be a local path or a
``file://``, ``hdfs://`` or ``s3a://`` location): :func:`discover_members` finds each
member's segment files (``archive/log-<base>.seg``) and reads its small files, its saved
commit position (``node-state.json``) and its recording log, through Spark's
``binaryFile`` data source.  :func:`scan` reads the segment files with ``binaryFile``
too, one file per partition (largest first), and decodes them on the executors
(``mapInArrow`` with :func:`segment_decoder`): the project's record checks
(:mod:`cluster.archive.record`) and log codec (:data:`cluster.protocol.codec.LOG`), into
Arrow record batches of :data:`BATCH_ROWS` rows.  No log bytes go through the driver.

A record that fails its checks (bad length or CRC, an incomplete record where the file
ends, a CRC-valid body that does not decode) does not raise on the executor: the decoder
emits a *problem row* (``type == PROBLEM``) naming the position and the reason and stops
reading that segment (or skips the one undecodable record, whose framing is intact).
The job collects those rows and either fails with all of them listed or, with
``--skip-corrupt``, leaves them out of the tables and lists them in the report.
"""

from __future__ import annotations

import itertools
import re
import tempfile
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..archive.errors import ArchiveCorruptionError
from ..archive.node_state import FILE_NAME as NODE_STATE_FILE
from ..archive.node_state import NodeState
from ..archive.reader import BadRecord
from ..archive.record import RECORD_HEADER, RECORD_HEADER_LENGTH, RecordError, iter_records
from ..archive.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, RecordingLog
from ..archive.recording_log import FILE_NAME as RECORDING_LOG_FILE
from ..protocol.codec import LOG
from ..protocol.enums import CLUSTER_ACTION_FLAG_TERMINATE
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
from .fs import HadoopFS, display, glob_escape

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BATCH_ROWS",
    "COLUMNS",
    "PROBLEM",
    "SCHEMA",
    "MemberArchive",
    "PipelineInputError",
    "Problem",
    "TermRecord",
    "action_name",
    "decode_segment",
    "discover_members",
    "scan",
    "segment_decoder",
]

PROBLEM = "PROBLEM"
"""``type`` of a problem row: ``position`` = where, ``length`` = bytes skipped, ``detail``."""
BATCH_ROWS = 65536
"""Rows per Arrow record batch."""

COLUMNS = (
    ("member", "STRING"),
    ("position", "BIGINT"),
    ("length", "INT"),
    ("crc", "BIGINT"),
    ("term", "BIGINT"),
    ("type", "STRING"),
    ("cluster_session_id", "BIGINT"),
    ("timestamp", "BIGINT"),
    ("payload_size", "INT"),
    ("correlation_id", "BIGINT"),
    ("close_reason", "STRING"),
    ("action", "STRING"),
    ("flags", "INT"),
    ("leader_member_id", "INT"),
    ("base_position", "BIGINT"),
    ("principal", "STRING"),
    ("response_stream_id", "INT"),
    ("response_channel", "STRING"),
    ("segment", "STRING"),
    ("detail", "STRING"),
)
"""Columns of the scan (name, Spark SQL type); docs/pipeline.md says what they mean."""
SCHEMA = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
"""The same as a Spark DDL string."""
_SPARSE = COLUMNS[9:18]
"""The columns that only some log messages have (correlation_id ... response_channel)."""

_SEGMENT_NAME = re.compile(r"log-(\d{20})\.seg")


def action_name(action: ClusterActionRequest) -> str:
    """SUSPEND, RESUME, SNAPSHOT, ABORT, or SHUTDOWN: any action with the terminate flag
    (a SNAPSHOT that stops every member), as ``cluster-tool shutdown`` requests it."""
    if action.flags & CLUSTER_ACTION_FLAG_TERMINATE:
        return "SHUTDOWN"
    return action.action.name


def principal_text(encoded: bytes) -> str | None:
    """The session's principal as text (UTF-8; other bytes as ``\\xNN``), None if empty."""
    if not encoded:
        return None
    return encoded.decode("utf-8", errors="backslashreplace")


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
    """One member's files, as found on the driver (no log bytes read).  Locations are
    qualified Hadoop paths (:mod:`.fs`)."""

    name: str
    directory: str
    """The member's data directory (``node-state.json``, ``recording.log``)."""
    archive_dir: str
    """The directory of its segment files."""
    segments: list[tuple[int, str, int]] = field(default_factory=list)
    """``(base position, location, size)`` in log order."""
    commit_position: int = 0
    """A lower bound of the commit position: the highest of the one saved in
    ``node-state.json`` and the position of the latest snapshot in ``recording.log`` (a
    snapshot is taken at a committed position); 0 if neither is there."""
    saved_commit_position: int = 0
    """As saved in ``node-state.json`` (0 if absent)."""
    snapshot_position: int = 0
    """The log position of the latest valid snapshot entry of ``recording.log`` (0 if none)."""
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
            "directory": display(self.directory),
            "archive": display(self.archive_dir),
            "segments": len(self.segments),
            "start_position": self.start_position,
            "end_position": self.end_position,
            "commit_position": self.commit_position,
            "saved_commit_position": self.saved_commit_position,
            "snapshot_position": self.snapshot_position,
            "node_state": self.has_node_state,
            "recording_log_terms": [asdict(t) for t in self.terms],
        }


# ---------------------------------------------------------------------- driver side


def _resolve(fs: HadoopFS, raw: str) -> list[tuple[str, str]]:
    """``(member dir, archive dir)`` pairs for one ``--archives`` argument."""
    info = fs.status(raw)
    if info is None:
        raise PipelineInputError(f"{raw}: no such directory")
    if not info.is_dir:
        raise PipelineInputError(f"{raw}: not a directory")
    entries = fs.listdir(info.location)
    archive = next((e for e in entries if e.is_dir and e.name == "archive"), None)
    if archive is not None:
        return [(info.location, archive.location)]
    if any(_SEGMENT_NAME.fullmatch(e.name) and not e.is_dir for e in entries):
        parent = fs.parent(info.location)
        has_state = parent is not None and fs.exists(fs.child(parent, NODE_STATE_FILE))
        return [(parent if has_state and parent is not None else info.location, info.location)]
    members = []
    for entry in entries:
        if entry.is_dir:
            inner = fs.status(fs.child(entry.location, "archive"))
            if inner is not None and inner.is_dir:
                members.append((entry.location, inner.location))
    if members:
        return members
    raise PipelineInputError(
        f"{raw}: no archive found (expected a member directory with archive/log-*.seg, "
        "a directory of log-*.seg files, or a directory of member directories)"
    )


def _list_segments(fs: HadoopFS, member: MemberArchive) -> None:
    """Fill ``member.segments``; a segment that does not start where the previous one ends
    is a problem (a truncated or missing segment file)."""
    found = []
    for entry in fs.listdir(member.archive_dir):
        match = _SEGMENT_NAME.fullmatch(entry.name)
        if match is not None and not entry.is_dir:
            found.append((int(match.group(1)), entry.location, entry.size))
    found.sort()
    for previous, current in itertools.pairwise(found):
        end = previous[0] + previous[2]
        if end != current[0]:
            first, second = fs.name(previous[1]), fs.name(current[1])
            why = (
                f"segment {first} ends at log position {end} but the next one, "
                f"{second}, starts at {current[0]}"
            )
            if end < current[0]:
                why += ": the segment file is truncated or a segment is missing"
            else:
                why += ": segments overlap"
            member.problems.append(
                Problem(member.name, display(previous[1]), end, why, max(0, current[0] - end))
            )
    member.segments = found


def _read_node_state(member: MemberArchive, location: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="triarch-node-state-") as tmp:
        (Path(tmp) / NODE_STATE_FILE).write_bytes(data)
        try:
            saved = NodeState(tmp).commit_position
        except ArchiveCorruptionError as exc:
            raise PipelineInputError(f"{display(location)}: {exc.reason}") from None
    member.saved_commit_position = saved
    member.has_node_state = True


def _read_recording_log(member: MemberArchive, location: str, data: bytes) -> None:
    """Valid TERM entries and the latest snapshot position of ``recording.log``, read
    from a local copy (opening a recording log repairs a torn last entry in place, and
    the archives here are read-only)."""
    with tempfile.TemporaryDirectory(prefix="triarch-recording-log-") as tmp:
        (Path(tmp) / RECORDING_LOG_FILE).write_bytes(data)
        try:
            with RecordingLog.open(tmp) as recording_log:
                entries = recording_log.entries
        except ArchiveCorruptionError as exc:
            member.problems.append(
                Problem(
                    member.name,
                    display(location),
                    exc.position,
                    f"recording log: {exc.reason}",
                    0,
                )
            )
            return
    valid = [e for e in entries if e.is_valid]
    member.terms = [
        TermRecord(e.leadership_term_id, e.term_base_log_position, e.log_position, e.timestamp)
        for e in valid
        if e.type == ENTRY_TYPE_TERM
    ]
    member.snapshot_position = max(
        (e.log_position for e in valid if e.type == ENTRY_TYPE_SNAPSHOT), default=0
    )


def discover_members(fs: HadoopFS, paths: Sequence[str]) -> list[MemberArchive]:
    """The members whose archives are in ``paths`` (member directories, archive directories
    or directories of member directories; paths or URIs), named after their directories.

    Raises:
        PipelineInputError: a path holds no archive, or ``node-state.json`` is unreadable.
    """
    pairs: list[tuple[str, str]] = []
    for raw in paths:
        for pair in _resolve(fs, str(raw)):
            if pair not in pairs:
                pairs.append(pair)
    members: list[MemberArchive] = []
    names: set[str] = set()
    small: dict[str, tuple[MemberArchive, str]] = {}
    for directory, archive_dir in pairs:
        name = fs.name(directory) or directory
        if name in names:
            parent = fs.parent(directory)
            name = f"{fs.name(parent) if parent else ''}/{name}"
        suffix = 2
        base_name = name
        while name in names:
            name = f"{base_name}#{suffix}"
            suffix += 1
        names.add(name)
        member = MemberArchive(name, directory, archive_dir)
        _list_segments(fs, member)
        for entry in fs.listdir(directory):
            if not entry.is_dir and entry.name in (NODE_STATE_FILE, RECORDING_LOG_FILE):
                small[entry.location] = (member, entry.name)
        members.append(member)
    for location, data in sorted(fs.read_files(list(small)).items()):
        member, kind = small[location]
        if kind == NODE_STATE_FILE:
            _read_node_state(member, location, data)
        else:
            _read_recording_log(member, location, data)
    for member in members:
        member.commit_position = max(member.saved_commit_position, member.snapshot_position)
    return members


def scan(
    spark: SparkSession, members: Sequence[MemberArchive], only: set[str] | None = None
) -> DataFrame:
    """Every member's segments (or those whose locations are in ``only``) decoded into
    rows of :data:`SCHEMA`, lazily: one ``binaryFile`` partition per segment file (the
    job sets ``spark.sql.files.openCostInBytes`` to ``maxPartitionBytes``), largest first.
    """
    plan = {
        location: (m.name, base, size)
        for m in members
        for base, location, size in m.segments
        if size > 0 and (only is None or location in only)
    }
    if not plan:
        return spark.createDataFrame([], SCHEMA)
    return (
        spark.read.format("binaryFile")
        .load([glob_escape(location) for location in plan])
        .select("path", "content")
        .mapInArrow(segment_decoder(plan), SCHEMA)
    )


# ---------------------------------------------------------------------- executor side


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32()}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


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
        self.extras: list[tuple[int, tuple[Any, ...], str | None]] = []
        """``(row, values of the _SPARSE columns, detail)``."""

    def __len__(self) -> int:
        return len(self.position)

    def problem(self, position: int, skipped: int, reason: str) -> None:
        self.extras.append((len(self.position), (None,) * len(_SPARSE), reason))
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
        flags: int | None = None
        leader: int | None = None
        base_position: int | None = None
        principal: str | None = None
        stream: int | None = None
        channel: str | None = None
        if isinstance(message, SessionOpenEvent):
            session, correlation = message.cluster_session_id, message.correlation_id
            payload_size = len(message.encoded_principal)
            principal = principal_text(message.encoded_principal)
            stream, channel = message.response_stream_id, message.response_channel
        elif isinstance(message, SessionCloseEvent):
            session = message.cluster_session_id
            close_reason = message.close_reason.name
        elif isinstance(message, TimerEvent):
            correlation = message.correlation_id
        elif isinstance(message, NewLeadershipTermEvent):
            leader, base_position = message.leader_member_id, message.term_base_log_position
        elif isinstance(message, ClusterActionRequest):
            action, flags = action_name(message), message.flags
        elif isinstance(message, MembershipChangeEvent):
            leader = message.leader_member_id
            action = message.change_type.name
        row = len(self.position)
        values = (correlation, close_reason, action, flags, leader, base_position, principal,
                  stream, channel)  # fmt: skip
        self.extras.append((row, values, None))
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
        sparse: list[list[Any]] = [[None] * n for _ in _SPARSE]
        detail: list[str | None] = [None] * n
        for row, values, reason in self.extras:
            for column, value in zip(sparse, values, strict=True):
                column[row] = value
            detail[row] = reason
        dense = {
            "member": [member] * n,
            "position": self.position,
            "length": self.length,
            "crc": self.crc,
            "term": self.term,
            "type": self.type,
            "cluster_session_id": self.session,
            "timestamp": self.timestamp,
            "payload_size": self.payload_size,
            **{name: column for (name, _), column in zip(_SPARSE, sparse, strict=True)},
            "segment": [segment] * n,
            "detail": detail,
        }
        return pa.RecordBatch.from_arrays(
            [pa.array(dense[f.name], f.type) for f in schema], schema=schema
        )


def scan_bytes(
    data: memoryview, base: int = 0
) -> Generator[tuple[int, memoryview], None, BadRecord | None]:
    """Yield ``(base + offset, body)`` for the records of a segment's bytes; return None
    if they are whole valid records, else the first bad one (as
    :func:`cluster.archive.reader.scan_records` does for a file)."""
    consumed = 0
    try:
        for offset, body in iter_records(data):
            if not body:
                return BadRecord(offset, "empty record", 0)
            yield base + offset, body
            consumed = offset + RECORD_HEADER_LENGTH + len(body)
    except RecordError as exc:
        length, _ = RECORD_HEADER.unpack_from(data, exc.offset)
        return BadRecord(exc.offset, exc.reason, length)
    remaining = len(data) - consumed
    if not remaining:
        return None
    header_length: int | None = None
    if remaining >= RECORD_HEADER_LENGTH:
        header_length = RECORD_HEADER.unpack_from(data, consumed)[0]
    return BadRecord(consumed, "incomplete record", header_length)


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


def decode_segment(
    member: str, location: str, base: int, length: int, data: Any
) -> Iterator[pa.RecordBatch]:
    """Decode the records of one segment file's bytes (``data``, any buffer) into Arrow
    batches (see :data:`SCHEMA`).

    Reads ``length`` bytes (the size seen when planning; a node may still be appending).
    Damage gives a problem row instead of an exception; reading stops at it.
    """
    schema = _arrow_schema()
    path = display(location)
    segment = location.rsplit("/", 1)[-1]
    decode = LOG.decode
    crc32 = zlib.crc32
    message_type = "SessionMessageHeader"
    view = memoryview(data).cast("B")
    size = min(length, len(view))
    records = _Records(scan_bytes(view[:size], base))
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
                    f"{path}: the file shrank to {size} bytes while it was read (it was {length})",
                )
        if len(batch):
            yield batch.build(schema, member, segment)


def segment_decoder(
    plan: dict[str, tuple[str, int, int]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function over ``binaryFile`` rows (``path``, ``content``):
    ``plan`` maps each segment's location to ``(member, base position, planned size)``."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            paths = batch.column("path")
            contents = batch.column("content")
            for row in range(batch.num_rows):
                location = str(paths[row].as_py())
                if location not in plan:
                    raise KeyError(f"binaryFile returned {location}, which was not planned")
                member, base, length = plan[location]
                yield from decode_segment(member, location, base, length, contents[row].as_buffer())

    return decode

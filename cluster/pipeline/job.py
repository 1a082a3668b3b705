"""The Spark job: archives in, Parquet tables, ``report.json`` and a plot out.

Steps (all data work on the executors; the driver handles file lists and small results):

1. :func:`~cluster.pipeline.source.discover_members` lists each member's segment files
   and reads its commit position (``node-state.json``, ``recording.log`` snapshots) and
   its recording-log terms, through Spark's Hadoop file system (paths or URIs).
2. One pass over the log: :func:`~cluster.pipeline.source.scan` decodes every segment
   (one partition each) straight into ``<out>/log_entries`` (Parquet), with a
   ``committed`` flag per row.
3. Problem rows (damaged records, rare) fail the job with every problem listed (their
   reasons read again from the damaged segments only) and nothing written, or with
   ``skip_corrupt`` are dropped from ``log_entries`` and reported.
4. From the *canonical log* (one entry per position, see :func:`canonical_log`):
   ``sessions``, ``terms``, ``timers`` and ``admin_actions``.
5. :mod:`.report` aggregates the report, checks cross-member consistency and draws the plot.

Every table is partitioned by ``date`` (the UTC calendar day of its time column) and
its times are Parquet ``TIMESTAMP_MICROS`` adjusted to UTC (see :data:`RUNTIME_CONF`).
"""

from __future__ import annotations

import ipaddress
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from .fs import HadoopFS, display, glob_escape, local_path
from .java import ensure_java
from .source import (
    PROBLEM,
    MemberArchive,
    PipelineInputError,
    Problem,
    discover_members,
    scan,
)

__all__ = [
    "DEFAULT_MASTER",
    "PARTITION_COLUMN",
    "RUNTIME_CONF",
    "TABLES",
    "CorruptArchiveError",
    "Options",
    "Result",
    "build_session",
    "canonical_log",
    "run",
]

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
TABLES = ("log_entries", "sessions", "terms", "timers", "admin_actions")
PARTITION_COLUMN = "date"
"""Every table is partitioned by the UTC calendar day (``date=2026-11-26``) of its time
column: the entry's for ``log_entries``, ``timers`` and ``admin_actions``, the open (or
first seen) time for ``sessions``, the start for ``terms``."""

RUNTIME_CONF = {
    # Parquet INT64 TIMESTAMP(isAdjustedToUTC=true, MICROS), not the legacy INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    # One segment file per binaryFile partition (see source.scan), one per Arrow batch.
    "spark.sql.files.openCostInBytes": "134217728",
    "spark.sql.files.maxPartitionBytes": "134217728",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "1",
}
"""Settings the job holds while it runs (and puts back after, in a session it was
given); the ``--conf`` options cannot change them."""

PYTHON_CONF = "spark.pyspark.python"

MESSAGE = "SessionMessageHeader"
OPEN = "SessionOpenEvent"
CLOSE = "SessionCloseEvent"
TIMER = "TimerEvent"
NEW_TERM = "NewLeadershipTermEvent"
ACTION = "ClusterActionRequest"


class CorruptArchiveError(Exception):
    """Damaged segment files, found without ``--skip-corrupt``; ``problems`` lists them."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = [p.describe() for p in self.problems]
        super().__init__(
            f"{len(lines)} damaged archive file(s); nothing was written "
            "(--skip-corrupt skips the damaged part and lists it in the report):\n  "
            + "\n  ".join(lines)
        )


@dataclass
class Options:
    archives: Sequence[str | os.PathLike[str]]
    """Paths or Hadoop URIs (``file://``, ``hdfs://``, ``s3a://``)."""
    out: str | os.PathLike[str]
    """A path or a Hadoop URI."""
    master: str | None = None
    skip_corrupt: bool = False
    conf: dict[str, str] = field(default_factory=dict)
    max_divergences: int = 100
    """Divergences listed in the report (all are counted)."""
    plot: bool = True


@dataclass
class Result:
    report: dict[str, Any]
    out: str
    """The output directory as a qualified Hadoop path (``file:/...``, ``s3a://...``)."""

    @property
    def consistent(self) -> bool:
        return bool(self.report["consistent"])

    @property
    def path(self) -> Path | None:
        """The output directory on this machine, when it is a local one."""
        local = local_path(self.out)
        return None if local is None else Path(local)


# ---------------------------------------------------------------------- session


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-")


def _is_loopback_master(master: str) -> bool:
    host = urlparse(master).hostname
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _under_spark_submit() -> bool:
    """Launched by ``spark-submit`` (which started the JVM and chose the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _submitted_conf() -> dict[str, str]:
    """The settings ``spark-submit`` gave the JVM it started (``--master``, ``--conf``)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # attach to spark-submit's JVM
    return dict(SparkConf().getAll())


def python_for_workers(conf: dict[str, str] | None = None) -> str:
    """The Python the executors run: ``spark.pyspark.python`` or ``PYSPARK_PYTHON`` when
    the user set either (``--conf``, ``spark-submit --conf``, the environment), else this
    interpreter (``sys.executable``).

    Sets ``PYSPARK_PYTHON`` (what PySpark reads), so that the Python workers import the
    same packages as the driver even when the virtualenv is not activated (``PATH`` then
    finds another ``python3``, or none)."""
    python = (conf or {}).get(PYTHON_CONF) or os.environ.get("PYSPARK_PYTHON") or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    return python


def build_session(master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession for the job: local Spark on loopback unless ``master`` says otherwise.

    In local mode and with a master on loopback (also when ``spark-submit`` chose it),
    the driver's address is 127.0.0.1 and the web UI is off, so nothing listens beyond
    loopback (unless ``--conf`` says otherwise).  Executors run this Python unless
    ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` says otherwise
    (:func:`python_for_workers`).
    """
    submitted = _under_spark_submit()
    given = {**(_submitted_conf() if submitted else {}), **(conf or {})}
    if master is None and not submitted:
        master = DEFAULT_MASTER
    effective = master or given.get("spark.master", DEFAULT_MASTER)
    builder = SparkSession.builder.appName("triarch-archive-pipeline")
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.sql.shuffle.partitions": "16",
        "spark.log.level": "WARN",
        "spark.ui.showConsoleProgress": "false",
        **RUNTIME_CONF,
    }
    if _is_local(effective) or _is_loopback_master(effective):
        if not submitted:
            os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        settings.update(
            {
                "spark.driver.host": LOOPBACK,
                "spark.driver.bindAddress": LOOPBACK,
                "spark.ui.enabled": "false",
            }
        )
    if not submitted:
        ensure_java()
    settings = {k: v for k, v in settings.items() if k not in given}
    settings.update(conf or {})
    settings[PYTHON_CONF] = python_for_workers(given)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not _is_local(effective) and not _is_loopback_master(effective):
        _ship_package(spark)
    return spark


def _ship_package(spark: SparkSession) -> None:
    """Send the ``cluster`` package to the executors of a remote cluster (they still need
    msgspec and pyarrow installed)."""
    package = Path(__file__).resolve().parent.parent
    target = Path(tempfile.mkdtemp(prefix="triarch-pipeline-")) / "triarch-cluster.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in package.rglob("*.py"):
            archive.write(path, path.relative_to(package.parent))
    spark.sparkContext.addPyFile(str(target))


@contextmanager
def _runtime_conf(spark: SparkSession) -> Iterator[None]:
    """Hold :data:`RUNTIME_CONF` while the job runs; put the session's values back."""
    before = {key: spark.conf.get(key, None) for key in RUNTIME_CONF}
    for key, value in RUNTIME_CONF.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


# ---------------------------------------------------------------------- tables


def _day(millis: Column) -> Column:
    """The UTC calendar day of an epoch-milliseconds column (whatever the session's time
    zone)."""
    return F.date_from_unix_date(F.floor(millis / F.lit(86_400_000)).cast("int"))


def _time(millis: str) -> Column:
    return F.timestamp_millis(F.col(millis))


def canonical_log(entries: DataFrame, members: Sequence[MemberArchive]) -> DataFrame:
    """One entry per log position: the member with the highest commit position supplies
    its whole log; each next member (by commit position, then log length) only the
    positions past the logs already taken. Up to the lowest commit position every member
    holds the same entries (the consistency check verifies it)."""
    order = sorted(
        (m for m in members if m.segments),
        key=lambda m: (-m.commit_position, -m.end_position, m.name),
    )
    parts: list[Column] = []
    covered = 0
    for member in order:
        if member.end_position <= covered:
            continue
        parts.append((F.col("member") == member.name) & (F.col("position") >= covered))
        covered = member.end_position
    if not parts:
        return entries.limit(0)
    condition = parts[0]
    for part in parts[1:]:
        condition = condition | part
    return entries.filter(condition)


def _committed_flag(members: Sequence[MemberArchive]) -> Column:
    """``position`` is below the row's member's commit position."""
    expr: Column | None = None
    for member in members:
        test = F.col("position") < F.lit(member.commit_position)
        expr = (
            F.when(F.col("member") == member.name, test)
            if expr is None
            else expr.when(F.col("member") == member.name, test)
        )
    return F.lit(False) if expr is None else expr.otherwise(F.lit(False))


def _sessions(canonical: DataFrame) -> DataFrame:
    is_msg = F.col("type") == MESSAGE
    is_open = F.col("type") == OPEN
    is_close = F.col("type") == CLOSE
    return (
        canonical.filter(F.col("cluster_session_id") >= 0)
        .groupBy("cluster_session_id")
        .agg(
            F.first(F.when(is_open, F.col("principal")), ignorenulls=True).alias("principal"),
            F.first(F.when(is_open, F.col("response_channel")), ignorenulls=True).alias(
                "response_channel"
            ),
            F.first(F.when(is_open, F.col("response_stream_id")), ignorenulls=True).alias(
                "response_stream_id"
            ),
            F.min(F.when(is_open, F.col("timestamp"))).alias("opened_timestamp"),
            F.min(F.when(is_open, F.col("term"))).alias("opened_term"),
            F.min(F.when(is_open, F.col("position"))).alias("open_position"),
            F.max(F.when(is_close, F.col("timestamp"))).alias("closed_timestamp"),
            F.max(F.when(is_close, F.col("position"))).alias("close_position"),
            F.first(F.col("close_reason"), ignorenulls=True).alias("close_reason"),
            F.count(F.when(is_msg, 1)).alias("message_count"),
            F.sum(F.when(is_msg, F.col("payload_size"))).alias("payload_bytes"),
            F.min(F.when(is_msg, F.col("timestamp"))).alias("first_message_timestamp"),
            F.max(F.when(is_msg, F.col("timestamp"))).alias("last_message_timestamp"),
            F.min("timestamp").alias("first_seen_timestamp"),
        )
        .withColumn("opened", _time("opened_timestamp"))
        .withColumn("closed", _time("closed_timestamp"))
        .withColumn("duration_ms", F.col("closed_timestamp") - F.col("opened_timestamp"))
        .withColumn("payload_bytes", F.coalesce(F.col("payload_bytes"), F.lit(0)))
        .withColumn(
            PARTITION_COLUMN,
            _day(F.coalesce(F.col("opened_timestamp"), F.col("first_seen_timestamp"))),
        )
        .drop("first_seen_timestamp")
    )


_TERMS_SCHEMA = StructType(
    [
        StructField("term", LongType(), False),
        StructField("leader", IntegerType(), True),
        StructField("base_position", LongType(), True),
        StructField("end_position", LongType(), True),
        StructField("start_timestamp", LongType(), True),
        StructField("entries", LongType(), False),
        StructField("messages", LongType(), False),
        StructField("recording_log_members", ArrayType(StringType()), False),
    ]
)


def _terms(
    spark: SparkSession,
    canonical: DataFrame,
    members: Sequence[MemberArchive],
    log_end: int,
) -> DataFrame:
    """Terms from the NewLeadershipTermEvents of the canonical log, with the entries and
    messages appended in each and the members whose recording log holds the same term
    (same base position). A term only in recording logs has no leader."""
    is_event = F.col("type") == NEW_TERM
    per_term = {
        int(r["term"]): r
        for r in canonical.filter(F.col("term").isNotNull())
        .groupBy("term")
        .agg(
            F.count("*").alias("entries"),
            F.count(F.when(F.col("type") == MESSAGE, 1)).alias("messages"),
            F.count(F.when(is_event, 1)).alias("events"),
            F.min(F.when(is_event, F.col("leader_member_id"))).alias("leader"),
            F.min(F.when(is_event, F.col("base_position"))).alias("base_position"),
            F.min(F.when(is_event, F.col("timestamp"))).alias("start_timestamp"),
            F.min("position").alias("first_position"),
            F.min("timestamp").alias("first_timestamp"),
        )
        .collect()
    }
    recorded: dict[int, list[tuple[str, int, int]]] = {}
    for member in members:
        for t in member.terms:
            recorded.setdefault(t.term, []).append((member.name, t.base_position, t.timestamp))
    rows: list[list[Any]] = []
    for term in sorted(set(per_term) | set(recorded)):
        found = per_term.get(term)
        has_event = found is not None and found["events"] > 0
        records = recorded.get(term, [])
        if has_event:
            assert found is not None
            base, start = int(found["base_position"]), int(found["start_timestamp"])
        elif records:
            base = min(b for _, b, _ in records)
            start = min(ts for _, _, ts in records)
        else:  # entries of a term whose start is not in the archives read
            assert found is not None
            base, start = int(found["first_position"]), int(found["first_timestamp"])
        rows.append(
            [
                term,
                int(found["leader"]) if has_event and found is not None else None,
                base,
                None,
                start,
                int(found["entries"]) if found is not None else 0,
                int(found["messages"]) if found is not None else 0,
                sorted(name for name, b, _ in records if b == base),
            ]
        )
    for row, following in zip(rows, [*rows[1:], None], strict=True):
        row[3] = following[2] if following is not None else log_end
    return (
        spark.createDataFrame([tuple(r) for r in rows], _TERMS_SCHEMA)
        .withColumn("start_time", _time("start_timestamp"))
        .withColumn(PARTITION_COLUMN, _day(F.col("start_timestamp")))
    )


def _timers(canonical: DataFrame) -> DataFrame:
    return canonical.filter(F.col("type") == TIMER).select(
        "correlation_id", "timestamp", "time", "term", "position", PARTITION_COLUMN
    )


def _admin_actions(canonical: DataFrame) -> DataFrame:
    """The cluster actions of the log (SUSPEND, RESUME, SNAPSHOT, SHUTDOWN, ABORT)."""
    return canonical.filter(F.col("type") == ACTION).select(
        "position",
        "term",
        "action",
        "flags",
        "timestamp",
        "time",
        "committed",
        PARTITION_COLUMN,
    )


# ---------------------------------------------------------------------- the job


def _problems(
    spark: SparkSession, members: Sequence[MemberArchive], written: DataFrame
) -> list[Problem]:
    """The problems found on the driver, and those the readers flagged (rows of type
    PROBLEM); their reasons come from reading the damaged segments again (rare)."""
    problems = [p for m in members for p in m.problems]
    damaged = {
        (row["member"], row["segment"])
        for row in written.filter(F.col("type") == PROBLEM)
        .select("member", "segment")
        .distinct()
        .collect()
    }
    if not damaged:
        return problems
    by_name = {m.name: m for m in members}
    locations = {
        location
        for m in members
        for _, location, _ in m.segments
        if (m.name, location.rsplit("/", 1)[-1]) in damaged
    }
    for row in (
        scan(spark, members, only=locations)
        .filter(F.col("type") == PROBLEM)
        .select("member", "position", "length", "segment", "detail")
        .orderBy("member", "position")
        .collect()
    ):
        member = by_name[row["member"]]
        location = next(
            loc for _, loc, _ in member.segments if loc.rsplit("/", 1)[-1] == row["segment"]
        )
        problems.append(
            Problem(
                member.name,
                display(location),
                int(row["position"]),
                str(row["detail"]),
                int(row["length"]),
                from_segment_data=True,
            )
        )
    return problems


def _write(table: DataFrame, location: str, *order: str) -> StructType:
    """Parquet partitioned by :data:`PARTITION_COLUMN`; ``order`` (a small table): one
    file per partition, sorted.  Returns the table's schema: a table with no rows has no
    files to infer it from (only ``_SUCCESS``)."""
    if order:
        table = table.coalesce(1).sortWithinPartitions(PARTITION_COLUMN, *order)
    table.write.mode("overwrite").partitionBy(PARTITION_COLUMN).parquet(location)
    return table.schema


def _read(spark: SparkSession, location: str, schema: StructType) -> DataFrame:
    """A table written by the job (its location taken literally, not as a glob)."""
    return spark.read.schema(schema).parquet(glob_escape(location))


def _drop_problem_rows(
    spark: SparkSession, fs: HadoopFS, entries_path: str, schema: StructType
) -> None:
    """Rewrite log_entries without the problem rows (``--skip-corrupt``)."""
    staging = entries_path + ".tmp"
    _write(_read(spark, entries_path, schema).filter(F.col("type") != PROBLEM), staging)
    fs.delete(entries_path)
    fs.rename(staging, entries_path)


def run(options: Options, spark: SparkSession | None = None) -> Result:
    """Run the job; return the report (also written to ``<out>/report.json``).

    Raises:
        PipelineInputError: an archive directory cannot be used at all.
        CorruptArchiveError: damaged files and not ``options.skip_corrupt``.
    """
    started = time.monotonic()
    if spark is None:
        spark = build_session(options.master, options.conf)
    with _runtime_conf(spark):
        return _run(spark, options, started)


def _run(spark: SparkSession, options: Options, started: float) -> Result:
    from . import report as reporting

    timings: dict[str, float] = {}
    mark = started

    def lap(step: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timings[step] = round(now - mark, 3)
        mark = now

    lap("session")
    fs = HadoopFS(spark)
    members = discover_members(fs, [os.fspath(a) for a in options.archives])
    if not any(m.segments for m in members):
        raise PipelineInputError(
            "no segment files in " + ", ".join(display(m.archive_dir) for m in members)
        )
    out = fs.qualify(os.fspath(options.out))
    lap("discover")
    fs.mkdirs(out)
    for name in (*TABLES, "log_entries.tmp", "report.json", "throughput.png"):
        fs.delete(fs.child(out, name))  # never leave the tables of an earlier run next to a failure

    entries_path = fs.child(out, "log_entries")
    try:
        # The one pass over the logs: decode every segment straight into log_entries.
        entries_schema = _write(
            scan(spark, members)
            .drop("detail")
            .withColumn("time", _time("timestamp"))
            .withColumn("committed", _committed_flag(members))
            .withColumn(PARTITION_COLUMN, _day(F.col("timestamp"))),
            entries_path,
        )
        lap("scan")
        problems = _problems(spark, members, _read(spark, entries_path, entries_schema))
        if problems and not options.skip_corrupt:
            raise CorruptArchiveError(problems)
        if any(p.from_segment_data for p in problems):
            _drop_problem_rows(spark, fs, entries_path, entries_schema)
        lap("problems")
    except BaseException:
        fs.delete(entries_path)
        raise

    entries = _read(spark, entries_path, entries_schema)
    canonical = canonical_log(entries, members)
    log_end = max(m.end_position for m in members)
    tables = {name: fs.child(out, name) for name in TABLES}
    schemas = {
        "sessions": _write(_sessions(canonical), tables["sessions"], "cluster_session_id"),
        "terms": _write(_terms(spark, canonical, members, log_end), tables["terms"], "term"),
        "timers": _write(_timers(canonical), tables["timers"], "position"),
        "admin_actions": _write(_admin_actions(canonical), tables["admin_actions"], "position"),
    }
    lap("tables")

    document = reporting.build(
        spark,
        members=members,
        entries=entries,
        canonical=canonical,
        sessions=_read(spark, tables["sessions"], schemas["sessions"]),
        terms=_read(spark, tables["terms"], schemas["terms"]),
        actions=_read(spark, tables["admin_actions"], schemas["admin_actions"]),
        problems=problems,
        max_divergences=options.max_divergences,
    )
    lap("report")
    document["tables"] = {name: display(location) for name, location in tables.items()}
    document["partitioned_by"] = PARTITION_COLUMN
    if options.plot:
        plot = fs.child(out, "throughput.png")
        fs.write_bytes(plot, reporting.plot_throughput(document))
        document["plot"] = display(plot)
        lap("plot")
    document["master"] = spark.sparkContext.master
    document["elapsed_seconds"] = round(time.monotonic() - started, 3)
    document["timings"] = timings
    fs.write_bytes(fs.child(out, "report.json"), reporting.encode(document))
    return Result(document, out)

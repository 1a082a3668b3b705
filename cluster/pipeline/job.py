"""The Spark job: archives in, Parquet tables, ``report.json`` and a plot out.

Steps (all data work on the executors; the driver handles file lists and small results):

1. :func:`~cluster.pipeline.source.discover_members` lists each member's segment files,
   its saved commit position (``node-state.json``) and its recording-log terms.
2. One pass over the log: the ``triarch_archive`` data source decodes every segment (one
   partition each) straight into ``<out>/log_entries`` (Parquet), with a ``committed``
   flag per row.
3. Problem rows (damaged records, rare) fail the job with every problem listed (their
   reasons read again from the damaged segments only) and nothing written, or with
   ``skip_corrupt`` are dropped from ``log_entries`` and reported.
4. From the *canonical log* (one entry per position, see :func:`canonical_log`):
   ``sessions``, ``terms`` and ``timers``.
5. :mod:`.report` aggregates the report, checks cross-member consistency and draws the plot.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
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

from .java import ensure_java
from .source import (
    FORMAT,
    PROBLEM,
    ArchiveDataSource,
    MemberArchive,
    PipelineInputError,
    Problem,
    discover_members,
    plan_partitions,
)

__all__ = [
    "DEFAULT_MASTER",
    "CorruptArchiveError",
    "Options",
    "Result",
    "build_session",
    "canonical_log",
    "run",
]

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
TABLES = ("log_entries", "sessions", "terms", "timers")

MESSAGE = "SessionMessageHeader"
OPEN = "SessionOpenEvent"
CLOSE = "SessionCloseEvent"
TIMER = "TimerEvent"
NEW_TERM = "NewLeadershipTermEvent"


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
    out: str | os.PathLike[str]
    master: str | None = None
    skip_corrupt: bool = False
    conf: dict[str, str] = field(default_factory=dict)
    max_divergences: int = 100
    """Divergences listed in the report (all are counted)."""
    plot: bool = True


@dataclass
class Result:
    report: dict[str, Any]
    out: Path

    @property
    def consistent(self) -> bool:
        return bool(self.report["consistent"])


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


def build_session(master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession for the job: local Spark on loopback unless ``master`` says otherwise.

    In local mode and with a master on loopback, ``SPARK_LOCAL_IP`` and the driver's
    address are 127.0.0.1 and the web UI is off, so nothing listens beyond loopback.
    Executors run this Python (``PYSPARK_PYTHON``) unless it is set already.
    """
    submitted = _under_spark_submit()
    if master is None and not submitted:
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName("triarch-archive-pipeline")
    loopback = master is not None and (_is_local(master) or _is_loopback_master(master))
    if master is not None:
        builder = builder.master(master)
    if loopback and not submitted:
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        builder = (
            builder.config("spark.driver.host", LOOPBACK)
            .config("spark.driver.bindAddress", LOOPBACK)
            .config("spark.ui.enabled", "false")
        )
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not submitted:
        ensure_java()
    settings = {
        "spark.sql.shuffle.partitions": "16",
        "spark.sql.session.timeZone": "UTC",
        "spark.log.level": "WARN",
        "spark.ui.showConsoleProgress": "false",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if master is not None and not _is_local(master) and not _is_loopback_master(master):
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


def _register(spark: SparkSession) -> None:
    """Register the data source once per session (registering again logs a warning)."""
    if not getattr(spark, "_triarch_source_registered", False):
        spark.dataSource.register(ArchiveDataSource)
        spark._triarch_source_registered = True  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- tables


def canonical_log(entries: DataFrame, members: Sequence[MemberArchive]) -> DataFrame:
    """One entry per log position: the member with the highest saved commit position
    supplies its whole log; each next member (by commit position, then log length) only
    the positions past the logs already taken. Up to the lowest commit position every
    member holds the same entries (the consistency check verifies it)."""
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
    """``position`` is below the row's member's saved commit position."""
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
        )
        .withColumn("opened", F.timestamp_millis("opened_timestamp"))
        .withColumn("closed", F.timestamp_millis("closed_timestamp"))
        .withColumn("duration_ms", F.col("closed_timestamp") - F.col("opened_timestamp"))
        .withColumn("payload_bytes", F.coalesce(F.col("payload_bytes"), F.lit(0)))
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
    return spark.createDataFrame([tuple(r) for r in rows], _TERMS_SCHEMA).withColumn(
        "start_time", F.timestamp_millis("start_timestamp")
    )


def _timers(canonical: DataFrame) -> DataFrame:
    return canonical.filter(F.col("type") == TIMER).select(
        "correlation_id",
        "timestamp",
        F.timestamp_millis("timestamp").alias("time"),
        "term",
        "position",
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
    for row in (
        spark.read.format(FORMAT)
        .option("plan", plan_partitions(members, only=damaged))
        .load()
        .filter(F.col("type") == PROBLEM)
        .select("member", "position", "length", "segment", "detail")
        .orderBy("member", "position")
        .collect()
    ):
        member = by_name[row["member"]]
        problems.append(
            Problem(
                member.name,
                str(member.archive_dir / row["segment"]),
                int(row["position"]),
                str(row["detail"]),
                int(row["length"]),
                from_segment_data=True,
            )
        )
    return problems


def _drop_problem_rows(spark: SparkSession, entries_path: Path) -> None:
    """Rewrite log_entries without the problem rows (``--skip-corrupt``)."""
    staging = entries_path.with_name(entries_path.name + ".tmp")
    (
        spark.read.parquet(str(entries_path))
        .filter(F.col("type") != PROBLEM)
        .write.mode("overwrite")
        .parquet(str(staging))
    )
    _remove(entries_path)
    staging.rename(entries_path)


def _write_small(table: DataFrame, key: str, path: Path) -> None:
    """One sorted Parquet file (a per-session or per-term table is small)."""
    table.coalesce(1).sortWithinPartitions(key).write.mode("overwrite").parquet(str(path))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def run(options: Options, spark: SparkSession | None = None) -> Result:
    """Run the job; return the report (also written to ``<out>/report.json``).

    Raises:
        PipelineInputError: an archive directory cannot be used at all.
        CorruptArchiveError: damaged files and not ``options.skip_corrupt``.
    """
    from . import report as reporting

    started = time.monotonic()
    timings: dict[str, float] = {}
    mark = started

    def lap(step: str) -> None:
        nonlocal mark
        now = time.monotonic()
        timings[step] = round(now - mark, 3)
        mark = now

    out = Path(options.out).resolve()
    members = discover_members(options.archives)
    if not any(m.segments for m in members):
        raise PipelineInputError(
            "no segment files in " + ", ".join(str(m.archive_dir) for m in members)
        )
    if spark is None:
        spark = build_session(options.master, options.conf)
    _register(spark)
    lap("session")
    out.mkdir(parents=True, exist_ok=True)
    for name in (*TABLES, "log_entries.tmp", "report.json", "throughput.png"):
        _remove(out / name)  # never leave the tables of an earlier run next to a failure

    entries_path = out / "log_entries"
    try:
        # The one pass over the logs: decode every segment straight into log_entries.
        (
            spark.read.format(FORMAT)
            .option("plan", plan_partitions(members))
            .load()
            .drop("detail")
            .withColumn("time", F.timestamp_millis("timestamp"))
            .withColumn("committed", _committed_flag(members))
            .write.mode("overwrite")
            .parquet(str(entries_path))
        )
        lap("scan")
        problems = _problems(spark, members, spark.read.parquet(str(entries_path)))
        if problems and not options.skip_corrupt:
            raise CorruptArchiveError(problems)
        if any(p.from_segment_data for p in problems):
            _drop_problem_rows(spark, entries_path)
        lap("problems")
    except BaseException:
        _remove(entries_path)
        raise

    entries = spark.read.parquet(str(entries_path))
    canonical = canonical_log(entries, members)
    log_end = max(m.end_position for m in members)
    sessions = _sessions(canonical)
    _write_small(sessions, "cluster_session_id", out / "sessions")
    terms = _terms(spark, canonical, members, log_end)
    _write_small(terms, "term", out / "terms")
    _write_small(_timers(canonical), "position", out / "timers")
    lap("tables")

    document = reporting.build(
        spark,
        members=members,
        entries=entries,
        canonical=canonical,
        sessions=spark.read.parquet(str(out / "sessions")),
        terms=spark.read.parquet(str(out / "terms")),
        problems=problems,
        max_divergences=options.max_divergences,
    )
    lap("report")
    document["tables"] = {name: str(out / name) for name in TABLES}
    if options.plot:
        plot = out / "throughput.png"
        reporting.plot_throughput(document, plot)
        document["plot"] = str(plot)
        lap("plot")
    document["master"] = spark.sparkContext.master
    document["elapsed_seconds"] = round(time.monotonic() - started, 3)
    document["timings"] = timings
    reporting.write(document, out / "report.json")
    return Result(document, out)

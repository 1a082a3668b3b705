"""``cluster-pipeline`` on the archives of a real 3-member run (KV load, a leader SIGKILL).

The archives are produced once per session (:mod:`cluster_run`: three client sessions
over TLS, admin actions, the leader killed while the second one writes, the killed
member restarted, a key with a TTL so that a timer fires, a SHUTDOWN at the end), then
the job runs in local Spark (``local[2]``) on them, on ``file://`` URIs of a copy in a
directory with a space in its name, on a copy where one record of one member was altered
(CRC kept valid), and on a copy with a truncated segment and a corrupt record.  A slow
test submits the job with the virtualenv's ``spark-submit`` and a clean environment (no
virtualenv on ``PATH``) to a standalone Spark master and worker started on 127.0.0.1 with
the scripts shipped inside pyspark.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
from cluster_run import PRINCIPAL, RunRecord, produce

from cluster.archive import encode_record, iter_records, read_log
from cluster.archive.node_state import NodeState
from cluster.archive.recording_log import ENTRY_TYPE_SNAPSHOT, RecordingLog
from cluster.local import free_ports, wait_for_port
from cluster.pipeline.__main__ import main as pipeline_main
from cluster.pipeline.java import ensure_java
from cluster.pipeline.job import TABLES, CorruptArchiveError, Options, Result, build_session, run
from cluster.pipeline.report import summary
from cluster.pipeline.source import PROBLEM, decode_segment
from cluster.protocol import codec
from cluster.protocol.ingress import SessionMessageHeader

MEMBERS = ("node-0", "node-1", "node-2")
MASTER = "local[2]"
QUICK_JIT = "-XX:TieredStopAtLevel=1"
"""The tests' JVMs live for a minute: the C2 compiler would cost more than it saves."""


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> RunRecord:
    """Archives of a 3-member run with load and a failover (made once per session)."""
    return produce(tmp_path_factory.mktemp("pipeline") / "cluster", per_phase=300)


@pytest.fixture(scope="session")
def archives(cluster_run: RunRecord) -> Path:
    return Path(cluster_run.directory)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    ensure_java()
    session = build_session(MASTER, {"spark.driver.extraJavaOptions": QUICK_JIT})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def good(archives: Path, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Result:
    """The job on the untouched archives."""
    out = tmp_path_factory.mktemp("pipeline-out") / "good"
    return run(Options([archives], out, master=MASTER), spark)


def copy_archives(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.log"))
    for member in MEMBERS:  # recording.log matches *.log: copy it back
        shutil.copy2(source / member / "recording.log", target / member / "recording.log")
    return target


def segments(directory: Path, member: str) -> list[Path]:
    return sorted((directory / member / "archive").glob("log-*.seg"))


def out_dir(result: Result) -> Path:
    assert result.path is not None
    return result.path


def table(out: Path | Result, name: str) -> list[dict[str, Any]]:
    """The rows of a table (its ``date`` partition column as a string)."""
    directory = out_dir(out) if isinstance(out, Result) else out
    rows: list[dict[str, Any]] = pq.read_table(directory / name).to_pylist()
    return rows


def commit_bounds(archives: Path) -> dict[str, int]:
    """Each member's commit position as the pipeline should take it: the highest of the
    one in ``node-state.json`` and its latest snapshot's in ``recording.log`` (read from
    a copy: opening a recording log may repair it)."""
    bounds: dict[str, int] = {}
    for member in MEMBERS:
        saved = NodeState(archives / member).commit_position
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(archives / member / "recording.log", tmp)
            with RecordingLog.open(tmp) as recording_log:
                snapshots = [
                    e.log_position
                    for e in recording_log.entries
                    if e.is_valid and e.type == ENTRY_TYPE_SNAPSHOT
                ]
        bounds[member] = max([saved, *snapshots])
    return bounds


def canonical_messages(archives: Path) -> Counter[int]:
    """Client messages per session in node-0's log, read with the project's reader."""
    counts: Counter[int] = Counter()
    for _, body in read_log(archives / "node-0" / "archive"):
        message = codec.LOG.decode(body)
        if isinstance(message, SessionMessageHeader):
            counts[message.cluster_session_id] += 1
    return counts


# ---------------------------------------------------------------------- good archives


def test_row_counts_match_what_the_clients_sent(
    good: Result, cluster_run: RunRecord, archives: Path
) -> None:
    report = good.report
    entries = table(good, "log_entries")
    per_member = Counter(row["member"] for row in entries)
    expected_entries = {m: sum(1 for _ in read_log(archives / m / "archive")) for m in MEMBERS}
    assert dict(per_member) == expected_entries
    assert len(set(expected_entries.values())) == 1  # the members hold the same log
    # committed: below the member's commit position, read here from its files
    bounds = commit_bounds(archives)
    for row in entries:
        assert row["committed"] == (row["position"] < bounds[row["member"]]), (row, bounds)
    # the run waited for commit saves before the SHUTDOWN, whose snapshot covers the rest
    shutdown = max(a["position"] for a in table(good, "admin_actions"))
    assert all(row["committed"] for row in entries if row["position"] < shutdown)
    assert max(bounds.values()) > shutdown, (bounds, report["archives"])

    sent = {s.cluster_session_id: s for s in cluster_run.sessions}
    assert len(sent) == 3
    sessions = {row["cluster_session_id"]: row for row in table(good, "sessions")}
    assert set(sessions) == set(sent)
    for session_id, client in sent.items():
        row = sessions[session_id]
        if client.phase == "across":
            # Resends after the failover may or may not have reached the log.
            assert client.acked <= row["message_count"] <= client.offers
        else:
            assert row["message_count"] == client.offers == client.requests == client.acked
        assert row["close_reason"] == "CLIENT_ACTION"
        # carried by the SessionOpenEvent: the name on the client's certificate, and the
        # dial-back endpoint of the session that asked for one ("" = the ingress link)
        assert row["principal"] == PRINCIPAL
        assert row["response_channel"] == client.response_channel
        assert row["opened"] is not None
        assert row["closed"] is not None
        assert row["duration_ms"] >= 0
    assert {k: v for k, v in canonical_messages(archives).items()} == {
        k: row["message_count"] for k, row in sessions.items()
    }
    assert report["log"]["messages"] == sum(r["message_count"] for r in sessions.values())
    listed = {
        s["cluster_session_id"]: s["messages"] for s in report["sessions"]["messages_per_session"]
    }
    assert listed == {k: row["message_count"] for k, row in sessions.items()}
    assert report["sessions"]["close_reasons"] == {"CLIENT_ACTION": 3}
    assert any(c.response_channel for c in sent.values())  # one session had a dial-back
    assert {s["principal"] for s in report["sessions"]["messages_per_session"]} == {PRINCIPAL}


def test_terms_timers_and_throughput(good: Result, cluster_run: RunRecord) -> None:
    terms = {row["term"]: row for row in table(good, "terms")}
    assert terms[cluster_run.term_killed]["leader"] == cluster_run.killed_leader
    assert terms[cluster_run.term_after]["leader"] == cluster_run.new_leader
    assert cluster_run.new_leader != cluster_run.killed_leader
    ordered = [terms[t] for t in sorted(terms)]
    for row, following in itertools.pairwise(ordered):
        assert row["end_position"] == following["base_position"]
    for row in ordered:
        assert row["recording_log_members"] == list(MEMBERS)
    by_term = {t["term"]: t for t in good.report["messages_per_term"]}
    assert sum(t["messages"] for t in by_term.values()) == good.report["log"]["messages"]
    assert by_term[cluster_run.term_after]["messages"] > 0

    timers = table(good, "timers")
    assert len(timers) >= 1  # the key put with a TTL expired through a cluster timer
    assert all(t["time"] is not None for t in timers)

    throughput = good.report["throughput"]
    assert throughput["series"]
    assert sum(s["messages"] for s in throughput["series"]) == good.report["log"]["messages"]
    plot = Path(good.report["plot"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.parent == good.path


def test_good_archives_are_consistent(good: Result) -> None:
    report = good.report
    assert report["consistent"] is True
    assert report["divergences"] == []
    assert report["skipped"] == []
    consistency = report["consistency"]
    assert consistency["checked_to"] == min(a["commit_position"] for a in report["archives"])
    assert consistency["checked_to"] > 0
    bounds = commit_bounds(Path(good.report["archives"][0]["directory"]).parent)
    assert consistency["checked_to"] == min(bounds.values())
    positions = {row["position"] for row in table(good, "log_entries")}
    assert consistency["positions_checked"] == sum(1 for p in positions if p < min(bounds.values()))
    on_disk = json.loads((out_dir(good) / "report.json").read_text())
    assert on_disk["consistent"] is True
    assert on_disk["log"] == report["log"]
    assert all(a["segments"] >= 2 for a in report["archives"])  # several partitions each


def test_admin_actions_are_a_table_and_marked(good: Result, cluster_run: RunRecord) -> None:
    actions = table(good, "admin_actions")
    assert [a["action"] for a in actions] == cluster_run.actions
    assert cluster_run.actions == ["SUSPEND", "RESUME", "SNAPSHOT", "SHUTDOWN"]
    assert [a["position"] for a in actions] == sorted(a["position"] for a in actions)
    shutdown = actions[-1]
    assert shutdown["flags"] & 0x100  # a SNAPSHOT with the terminate flag, named SHUTDOWN
    # committed: the members' shutdown snapshots in recording.log are past it
    assert all(a["committed"] for a in actions)
    assert all(a["time"] is not None and a["term"] is not None for a in actions)
    by_position = {r["position"]: r for r in table(good, "log_entries")}
    assert by_position[shutdown["position"]]["action"] == "SHUTDOWN"
    listed = good.report["admin_actions"]
    assert [a["action"] for a in listed] == cluster_run.actions
    assert all(a["time"].endswith("Z") for a in listed)
    assert "SHUTDOWN at" in summary(good.report)


TIME_COLUMNS = {
    "log_entries": {"time"},
    "sessions": {"opened", "closed"},
    "terms": {"start_time"},
    "timers": {"time"},
    "admin_actions": {"time"},
}


def test_timestamps_are_utc_micros_and_tables_partitioned_by_date(good: Result) -> None:
    """Read with pyarrow: the footer's physical and logical types, the partition folders."""
    out = out_dir(good)
    assert set(TIME_COLUMNS) == set(TABLES)
    for name, expected in TIME_COLUMNS.items():
        folders = sorted(p.name for p in (out / name).iterdir() if p.is_dir())
        assert folders, name
        assert all(f.startswith("date=") for f in folders), (name, folders)
        files = sorted((out / name).glob("date=*/*.parquet"))
        assert files, name
        schema = pq.ParquetFile(files[0]).schema
        columns = [schema.column(i) for i in range(len(schema.names))]
        assert not [c.name for c in columns if c.physical_type == "INT96"], name
        timestamps = {
            c.name: json.loads(c.logical_type.to_json())
            for c in columns
            if c.logical_type.type == "TIMESTAMP"
        }
        assert set(timestamps) == expected, name
        for column, logical in timestamps.items():
            assert schema.column(schema.names.index(column)).physical_type == "INT64"
            assert logical["isAdjustedToUTC"] is True, (name, column, logical)
            assert logical["timeUnit"] == "microseconds", (name, column, logical)
        arrow = pq.read_table(out / name)
        for column in expected:
            assert arrow.schema.field(column).type == pa.timestamp("us", tz="UTC")
    # The partition of each entry is the UTC day of its cluster timestamp.
    for row in table(good, "log_entries"):
        moment = row["time"]
        assert moment.utcoffset() == dt.timedelta(0)
        assert moment == dt.datetime.fromtimestamp(row["timestamp"] / 1000, tz=dt.UTC)
        assert row["date"] == moment.date().isoformat()
    assert good.report["partitioned_by"] == "date"


def test_uri_locations_with_a_space(
    archives: Path, good: Result, spark: Any, tmp_path: Path
) -> None:
    """``file://`` URIs (written unescaped, as Hadoop paths are) for the archives and the
    output, in directories whose names hold a space (and glob characters)."""
    copy = copy_archives(archives, tmp_path / "archive copy [1]" / "cluster")
    out = tmp_path / "audit out [2]"
    result = run(Options([f"file://{copy}"], f"file://{out}", master=MASTER), spark)
    assert result.out == f"file:{out}"
    assert result.path == out
    assert result.report["consistent"] is True
    assert result.report["log"] == good.report["log"]
    assert [a["directory"] for a in result.report["archives"]] == [str(copy / m) for m in MEMBERS]
    for name in TABLES:
        assert table(result, name) == table(good, name), name
    assert json.loads((out / "report.json").read_text())["consistent"] is True
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(out.glob(".*.crc"))  # written on the raw local file system


HIDE_PYSPARK = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
from cluster.pipeline.__main__ import main
sys.exit(main())
"""


def test_without_pyspark_a_clear_message(tmp_path: Path) -> None:
    """What ``cluster-pipeline`` does where PySpark is not installed (an import hook hides
    it): one line naming the extra, exit status 2, no traceback."""
    command = [sys.executable, "-c", HIDE_PYSPARK, "--archives", str(tmp_path), "--out",
               str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "PySpark is not installed" in result.stderr
    assert "pip install 'triarch[spark]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_run_as_a_file_by_a_python_without_the_packages(tmp_path: Path) -> None:
    """``spark-submit`` runs ``__main__.py`` as a file, with ``python3`` from ``PATH`` when
    ``PYSPARK_PYTHON`` is not set: a Python without the packages (here ``-S``: no
    site-packages) gets a message saying what to set, exit status 2, no traceback."""
    import cluster.pipeline.__main__ as entry

    command = [sys.executable, "-S", entry.__file__, "--archives", str(tmp_path), "--out",
               str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "cannot import" in result.stderr
    assert "PYSPARK_PYTHON=" in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_tables(spark: Any, tmp_path: Path) -> None:
    """A synthetic archive (``scripts/pipeline_bench.py``) with no admin action and no
    timer: those tables are empty (no partition folder) and the report still builds."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "pipeline_bench.py"
    spec = importlib.util.spec_from_file_location("pipeline_bench", path)
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.write_member(tmp_path / "cluster" / "node-0", 500, segment_size=4096, payload=8,
                       session_length=50, rate=10)  # fmt: skip
    result = run(Options([tmp_path / "cluster"], tmp_path / "out", master=MASTER), spark)
    report = result.report
    assert report["consistent"] is True
    assert report["log"]["entries"] == 500
    assert report["admin_actions"] == []
    for name in ("timers", "admin_actions"):
        assert not list((out_dir(result) / name).glob("date=*")), name
    assert len(table(result, "sessions")) == report["sessions"]["count"] > 0
    assert "admin actions" not in summary(report)


# ---------------------------------------------------------------------- an altered copy


def alter_one_message(segment: Path) -> int:
    """Change one payload byte of a client message in the middle of ``segment`` and fix
    the record's CRC (a real divergence, not corruption); return its log position."""
    data = bytearray(segment.read_bytes())
    base = int(segment.stem.split("-")[1])
    records = [
        (offset, bytes(body))
        for offset, body in iter_records(data)
        if isinstance(codec.LOG.decode(body), SessionMessageHeader)
    ]
    offset, body = records[len(records) // 2]
    message = codec.LOG.decode(body)
    assert isinstance(message, SessionMessageHeader)
    payload = bytearray(message.payload)
    payload[-1] ^= 0x01
    altered = codec.encode(msgspec.structs.replace(message, payload=bytes(payload)))
    framed = encode_record(altered)
    assert len(framed) == len(body) + 8
    data[offset : offset + len(framed)] = framed
    segment.write_bytes(bytes(data))
    assert sum(1 for _ in iter_records(data)) == sum(1 for _ in iter_records(segment.read_bytes()))
    return base + offset


def test_altered_copy_is_inconsistent(
    archives: Path, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = copy_archives(archives, tmp_path / "altered")
    position = alter_one_message(segments(copy, "node-1")[1])
    out = tmp_path / "out"
    code = pipeline_main(["--archives", str(copy), "--out", str(out), "--master", MASTER])
    printed = capsys.readouterr().out
    assert code == 1  # report written, members inconsistent
    assert "NOT CONSISTENT" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["consistent"] is False
    assert report["consistency"]["divergent_positions"] == 1
    [divergence] = report["divergences"]
    assert divergence["member"] == "node-1"
    assert divergence["position"] == position
    assert "body bytes differ" in divergence["what"]
    assert "node-0, node-2" in divergence["what"]
    assert report["skipped"] == []  # not corruption: every CRC is valid
    assert f"node-1 @ {position}" in printed


# ---------------------------------------------------------------------- damaged copies


def damage(copy: Path) -> tuple[Path, int, Path, int]:
    """Truncate node-1's first segment inside a record; flip a body byte of a record of
    node-2's last segment (its CRC then fails).  Return (file, position) of each."""
    first = segments(copy, "node-1")[0]
    data = first.read_bytes()
    offsets = [offset for offset, _ in iter_records(data)]
    cut = offsets[len(offsets) // 2] + 5
    first.write_bytes(data[:cut])
    truncated_at = int(first.stem.split("-")[1]) + offsets[len(offsets) // 2]

    last = segments(copy, "node-2")[-1]
    raw = bytearray(last.read_bytes())
    offsets = [offset for offset, _ in iter_records(raw)]
    victim = offsets[len(offsets) // 3]
    raw[victim + 8 + 2] ^= 0xFF
    last.write_bytes(bytes(raw))
    return first, truncated_at, last, int(last.stem.split("-")[1]) + victim


def test_damaged_segments_fail_with_file_and_position(
    archives: Path, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = copy_archives(archives, tmp_path / "damaged")
    truncated, truncated_at, corrupt, corrupt_at = damage(copy)
    out = tmp_path / "out"
    with pytest.raises(CorruptArchiveError) as caught:
        run(Options([copy], out, master=MASTER), spark)
    message = str(caught.value)
    assert f"{truncated}: truncated at log position {truncated_at}" in message
    assert f"{corrupt}: corrupt record at log position {corrupt_at}" in message
    assert "crc mismatch" in message
    # the gap between node-1's truncated first segment and its second one
    assert f"segment {truncated.name} ends at log position" in message
    assert not (out / "report.json").exists()
    assert not (out / "log_entries").exists()

    code = pipeline_main(["--archives", str(copy), "--out", str(out), "--master", MASTER])
    err = capsys.readouterr().err
    assert code == 2
    assert str(truncated) in err
    assert str(corrupt) in err


def test_skip_corrupt_skips_and_lists(
    archives: Path, good: Result, spark: Any, tmp_path: Path
) -> None:
    copy = copy_archives(archives, tmp_path / "damaged")
    truncated, truncated_at, corrupt, corrupt_at = damage(copy)
    result = run(
        Options([copy], tmp_path / "out", master=MASTER, skip_corrupt=True, max_divergences=5000),
        spark,
    )
    report = result.report
    skipped = {(s["file"], s["position"]) for s in report["skipped"]}
    assert (str(truncated), truncated_at) in skipped
    assert (str(corrupt), corrupt_at) in skipped
    assert all(s["skipped_bytes"] > 0 and s["reason"] for s in report["skipped"])
    # node-1 and node-2 lost committed entries: the audit cannot call them consistent
    assert report["consistent"] is False
    assert {d["member"] for d in report["divergences"]} == {"node-1", "node-2"}
    assert all(d["what"].startswith("unreadable") for d in report["divergences"])
    # node-0 is intact and supplies the cluster-level tables
    assert report["log"] == good.report["log"]
    assert table(result, "sessions") == table(good, "sessions")
    entries = Counter(row["member"] for row in table(result, "log_entries"))
    assert entries["node-0"] > entries["node-1"]
    assert entries["node-0"] > entries["node-2"]
    assert PROBLEM not in {row["type"] for row in table(result, "log_entries")}


def segment_rows(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    batches = decode_segment("m", f"file:{path}", 0, len(data), pa.py_buffer(data))
    return [row for batch in batches for row in batch.to_pylist()]


def test_reader_flags_zero_fill_and_undecodable_records(tmp_path: Path) -> None:
    """No Spark: the partition reader turns damage into problem rows."""
    good_body = codec.encode(SessionMessageHeader(0, 1, 5, b"x"))
    path = tmp_path / "log-00000000000000000000.seg"
    path.write_bytes(encode_record(good_body) + encode_record(b"\xc1") + encode_record(good_body))
    rows = segment_rows(path)
    assert [r["type"] for r in rows] == ["SessionMessageHeader", PROBLEM, "SessionMessageHeader"]
    assert "undecodable log message" in rows[1]["detail"]

    path.write_bytes(encode_record(good_body) + b"\0" * 64)  # a crash after extending the file
    rows = segment_rows(path)
    assert [r["type"] for r in rows] == ["SessionMessageHeader", PROBLEM]
    assert rows[1]["position"] == len(encode_record(good_body))
    assert rows[1]["length"] == 64
    assert "empty record" in rows[1]["detail"]


# ---------------------------------------------------------------------- no virtualenv


def clean_env(**extra: str) -> dict[str, str]:
    """An environment with no virtualenv in it: ``PATH`` has only the system folders (whose
    ``python3``, if any, lacks the project's packages)."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    env.update(extra)
    return env


def check_run(result: subprocess.CompletedProcess[str], out: Path, good: Result) -> None:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "CONSISTENT" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["consistent"] is True
    assert report["log"] == good.report["log"]
    assert table(out, "sessions") == table(good, "sessions")


# ---------------------------------------------------------------------- standalone Spark


def _spark_daemon(spark_home: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(
        ["bash", str(spark_home / "sbin" / "spark-daemon.sh"), *args],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )


MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@pytest.mark.slow
def test_standalone_master_and_worker(archives: Path, good: Result, tmp_path: Path) -> None:
    """A Spark master and worker on 127.0.0.1 (pyspark's own sbin scripts), and the job
    submitted to them as docs/pipeline.md says, with a clean environment (nothing set, no
    virtualenv on ``PATH``: the ``python3`` there lacks the packages): the virtualenv's
    ``spark-submit`` given the file that ``cluster-pipeline --script`` prints, with
    ``PYSPARK_PYTHON`` naming the virtualenv's Python, ``--master spark://`` and
    ``file://`` URIs.  (One job for both: each costs a JVM and most of a minute.)"""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    if not spark_submit.exists():
        pytest.skip(f"no spark-submit next to {sys.executable}")
    script = subprocess.run(
        [str(Path(sys.executable).parent / "cluster-pipeline"), "--script"],
        capture_output=True, text=True, check=True, env=clean_env(), cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert Path(script).name == "__main__.py"
    import pyspark

    spark_home = Path(pyspark.__file__).resolve().parent
    master_port, master_ui, worker_port, worker_ui = free_ports(4)
    quick_jit = QUICK_JIT
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "SPARK_PID_DIR": str(tmp_path / "pids"),
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_IDENT_STRING": f"triarch-test-{os.getpid()}",
        "SPARK_DAEMON_JAVA_OPTS": quick_jit,
        "PYSPARK_PYTHON": sys.executable,
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    master = f"spark://127.0.0.1:{master_port}"
    started: list[str] = []
    begin = time.monotonic()
    try:
        start_master = spark_home / "sbin" / "start-master.sh"
        if start_master.exists():  # full Spark distributions ship it; the wheel does not
            subprocess.run(
                ["bash", str(start_master), "--host", "127.0.0.1", "--port", str(master_port),
                 "--webui-port", str(master_ui)],
                env=env, check=True, capture_output=True, timeout=60,
            )  # fmt: skip
        else:  # what start-master.sh runs
            _spark_daemon(spark_home, env, "start", MASTER_CLASS, "1", "--host", "127.0.0.1",
                          "--port", str(master_port), "--webui-port", str(master_ui))  # fmt: skip
        started.append(MASTER_CLASS)
        # The worker retries until the master listens; the job waits for the worker.
        _spark_daemon(spark_home, env, "start", WORKER_CLASS, "1", "--host", "127.0.0.1",
                      "--port", str(worker_port), "--webui-port", str(worker_ui),
                      "--cores", "2", "--memory", "2g", master)  # fmt: skip
        started.append(WORKER_CLASS)
        assert wait_for_port("127.0.0.1", master_port, 60), "the Spark master did not start"
        daemons = time.monotonic() - begin
        out = tmp_path / "out"
        command = [
            str(spark_submit), "--master", master,
            "--conf", "spark.executor.memory=1g",
            "--driver-java-options", quick_jit,
            "--conf", f"spark.executor.extraJavaOptions={quick_jit}",
            script, "--archives", f"file://{archives}", "--out", f"file://{out}",
        ]  # fmt: skip
        job_env = clean_env(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        result = subprocess.run(
            command, env=job_env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        check_run(result, out, good)
        report = json.loads((out / "report.json").read_text())
        assert report["master"] == master
        print(
            f"\n[pipeline] standalone: master+worker up in {daemons:.1f}s, job "
            f"{time.monotonic() - begin - daemons:.1f}s (in the job: {report['timings']})"
        )
    finally:
        for daemon in reversed(started):
            with contextlib.suppress(subprocess.SubprocessError):
                _spark_daemon(spark_home, env, "stop", daemon, "1")

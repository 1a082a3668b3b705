"""``cluster-pipeline``: archive analytics and cross-member audit on Apache Spark.

    cluster-pipeline --archives LOCATION [LOCATION ...] --out LOCATION [--master URL]
                     [--skip-corrupt]

Reads the archives of one or more members (member directories such as
``cluster-data/node-0``, their ``archive/`` directories, or a directory holding member
directories; local paths or Hadoop URIs such as ``file:///data/run``,
``hdfs://nn:8020/triarch``, ``s3a://bucket/run``), writes the Parquet tables
``log_entries``, ``sessions``, ``terms``, ``timers`` and ``admin_actions`` (partitioned
by ``date``), ``report.json`` and ``throughput.png`` to ``--out`` (a path or a URI too),
and prints a summary.  See ``docs/pipeline.md``.

Exit status: 0 when the members are consistent, 1 when they are not (the report lists
the divergences), 2 when the job could not run (damaged archives without
``--skip-corrupt``, unusable paths, no Java, PySpark not installed).

Through ``spark-submit`` (the master then comes from spark-submit), with the Python of
the virtualenv where ``triarch[spark]`` is installed (nothing needs to be activated)::

    PYSPARK_PYTHON=/opt/triarch/.venv/bin/python /opt/triarch/.venv/bin/spark-submit \\
        --master 'local[4]' "$(/opt/triarch/.venv/bin/python -m cluster.pipeline --script)" \\
        --archives ... --out ...
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

EXIT_CONSISTENT = 0
EXIT_INCONSISTENT = 1
EXIT_ERROR = 2

EXTRA = "pip install 'triarch[spark]'"
"""How to install what the pipeline needs (the ``spark`` extra)."""


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


class _PrintScript(argparse.Action):
    """``--script``: print the path of this file (what spark-submit runs) and exit."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=(
            "print the path of the file to give spark-submit, and exit"))  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(os.path.abspath(__file__))
        parser.exit()


def parser() -> argparse.ArgumentParser:
    from cluster.config import add_version

    p = argparse.ArgumentParser(
        prog="cluster-pipeline",
        description="Archive analytics and cross-member consistency audit on Apache Spark.",
        epilog="Locations are local paths or Hadoop URIs (file://, hdfs://, s3a://). "
        "Exit status: 0 consistent, 1 divergences found, 2 the job could not run.",
    )
    add_version(p)
    p.add_argument("--script", action=_PrintScript)
    p.add_argument(
        "--archives",
        nargs="+",
        required=True,
        metavar="LOCATION",
        help="member directories (with archive/), archive directories, or a cluster "
        "directory holding member directories: paths or URIs",
    )
    p.add_argument(
        "--out", required=True, metavar="LOCATION", help="output directory: a path or a URI"
    )
    p.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default local[*] on loopback; spark://HOST:PORT for a cluster)",
    )
    p.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="skip damaged segment data (from the bad record to the end of its segment) and "
        "list it in the report, instead of failing",
    )
    p.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting (repeatable)",
    )
    p.add_argument(
        "--max-divergences",
        type=int,
        default=100,
        metavar="N",
        help="divergences listed in the report (all are counted; default 100)",
    )
    p.add_argument("--no-plot", action="store_true", help="do not draw throughput.png")
    return p


def missing_dependency(plot: bool = True) -> str | None:
    """A line saying what is not installed (PySpark, PyArrow, matplotlib), or None."""
    needed = [("pyspark", "PySpark"), ("pyarrow", "PyArrow")]
    if plot:
        needed.append(("matplotlib", "matplotlib (for the plot; --no-plot goes without)"))
    for module, name in needed:
        try:
            importlib.import_module(module)
        except ImportError:
            return f"{name} is not installed in {sys.executable}: {EXTRA}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    missing = missing_dependency(plot=not args.no_plot)
    if missing is not None:
        print(f"cluster-pipeline: {missing}", file=sys.stderr)
        return EXIT_ERROR
    from cluster.pipeline.java import JavaMissingError
    from cluster.pipeline.job import CorruptArchiveError, Options, run
    from cluster.pipeline.report import summary
    from cluster.pipeline.source import PipelineInputError

    options = Options(
        archives=args.archives,
        out=args.out,
        master=args.master,
        skip_corrupt=args.skip_corrupt,
        conf=dict(args.conf),
        max_divergences=args.max_divergences,
        plot=not args.no_plot,
    )
    try:
        result = run(options)
    except (CorruptArchiveError, PipelineInputError, JavaMissingError) as exc:
        print(f"cluster-pipeline: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception:  # a Spark failure: keep its trace, but not exit status 1
        traceback.print_exc()
        print("cluster-pipeline: error: the Spark job failed (trace above)", file=sys.stderr)
        return EXIT_ERROR
    print(summary(result.report), flush=True)
    return EXIT_CONSISTENT if result.consistent else EXIT_INCONSISTENT


def _run_as_file() -> int:
    """Run as a file (``spark-submit .../cluster/pipeline/__main__.py``): this directory
    comes off ``sys.path`` (its ``java.py``, ``job.py``... would shadow other modules) and
    the package is imported from where it is installed, or from the tree this file is in.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import cluster
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.dirname(here)))
    try:
        import cluster.config  # noqa: F401  (and what it needs: msgspec...)
        from cluster.pipeline.__main__ import main as package_main
    except ImportError as exc:
        print(
            f"cluster-pipeline: {sys.executable} cannot import {exc.name or exc}: run "
            "spark-submit with the Python where triarch[spark] is installed: "
            "PYSPARK_PYTHON=/path/to/venv/bin/python spark-submit ... (docs/pipeline.md)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return package_main()


if __name__ == "__main__":
    sys.exit(main() if __package__ else _run_as_file())

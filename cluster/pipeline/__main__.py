"""``cluster-pipeline``: archive analytics and cross-member audit on Apache Spark.

    cluster-pipeline --archives DIR [DIR ...] --out DIR [--master URL] [--skip-corrupt]

Reads the archives of one or more members (member directories such as
``cluster-data/node-0``, their ``archive/`` directories, or a directory holding member
directories), writes the Parquet tables ``log_entries``, ``sessions``, ``terms`` and
``timers``, ``report.json`` and ``throughput.png`` to ``--out``, and prints a summary.

Exit status: 0 when the members are consistent, 1 when they are not (the report lists
the divergences), 2 when the job could not run (damaged archives without
``--skip-corrupt``, unusable paths, no Java).

Through ``spark-submit`` (the master then comes from spark-submit)::

    spark-submit "$(python -c 'import cluster.pipeline.__main__ as m; print(m.__file__)')" \\
        --archives ... --out ...
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from ..config import add_version

EXIT_CONSISTENT = 0
EXIT_INCONSISTENT = 1
EXIT_ERROR = 2


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-pipeline",
        description="Archive analytics and cross-member consistency audit on Apache Spark.",
        epilog="Exit status: 0 consistent, 1 divergences found, 2 the job could not run.",
    )
    add_version(p)
    p.add_argument(
        "--archives",
        nargs="+",
        required=True,
        metavar="DIR",
        help="member directories (with archive/), archive directories, or a cluster "
        "directory holding member directories",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from cluster.pipeline.java import JavaMissingError
        from cluster.pipeline.job import CorruptArchiveError, Options, run
        from cluster.pipeline.report import summary
        from cluster.pipeline.source import PipelineInputError
    except ImportError as exc:
        print(
            f"cluster-pipeline: {exc}; install the spark extra: pip install -e '.[spark]'",
            file=sys.stderr,
        )
        return EXIT_ERROR
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


if __name__ == "__main__":
    sys.exit(main())

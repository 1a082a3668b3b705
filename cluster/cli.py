"""What every Triarch command's command line shares, apart from the node's settings.

``cluster-node``, ``cluster-tool``, ``cluster-backup``, ``cluster-tui`` and the pipeline
each build their own parser; these are the conventions they have in common: ``--version``
(:func:`add_version`), usage errors that print the usage line and exit with code 2
(:class:`UsageParser`, which also parses ``--members`` for the tools), and durations
given as ``2s`` or ``250ms`` (:func:`duration_seconds`), and the variable of a client's
certificate folder (:data:`CLIENT_CERTS_VARIABLE`).  The node's own settings, each
a flag, a ``CLUSTER_*`` variable and a TOML key, are :mod:`cluster.config`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from .members import MemberEndpoints, check_members, parse_members
from .units import parse_duration_ns

__all__ = ["CLIENT_CERTS_VARIABLE", "UsageParser", "add_version", "duration_seconds"]

CLIENT_CERTS_VARIABLE = "CLUSTER_CLIENT_CERTS_DIR"
"""The variable the tools take their ``--certs-dir`` (a ``client-NAME`` folder) from.  Not
``CLUSTER_CERTS_DIR``: that is the member's setting (a ``member-<id>`` folder), and one
exported for a tool would be read by the next member started in that shell."""


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: prints the command's name and Triarch's version, then exits."""
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s (Triarch) {__version__}")


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors print the usage line and exit with code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def members(self, text: str | None) -> list[MemberEndpoints]:
        """The ``--members`` value parsed, or a usage error saying what is wrong."""
        if not text:
            self.error("--members is required (or set CLUSTER_MEMBERS)")
        try:
            return check_members(parse_members(text), ports=False)
        except ValueError as exc:
            self.error(f"--members: {exc}")


def add_members(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """``--members``, defaulting to ``$CLUSTER_MEMBERS`` (``default``: what to use
    instead, e.g. ``argparse.SUPPRESS`` on a subcommand)."""
    parser.add_argument(
        "--members",
        default=os.environ.get("CLUSTER_MEMBERS", "") if default is None else default,
        help="0=host:ingress:consensus:admin,1=... (default: $CLUSTER_MEMBERS)",
    )


def duration_seconds(text: str) -> float:
    """argparse ``type=`` for a positive duration (``2s``, ``250ms``), in seconds."""
    try:
        seconds = parse_duration_ns(text) / 1e9
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return seconds

"""Triarch: a fault-tolerant replicated state machine for Python, modelled on Aeron
Cluster.  The version below is the package's only one (``pyproject.toml`` reads it)."""

from .native import check as _check_native

__version__ = "0.2.0"

_check_native()  # a compiled core (scripts/dev.py native) must match its sources

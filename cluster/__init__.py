"""Triarch: a fault-tolerant replicated state machine for Python, modelled on Aeron
Cluster.  The version below is the package's only one (``pyproject.toml`` reads it)."""

__version__ = "0.2.0"

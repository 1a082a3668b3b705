"""Errors raised by the protocol layer."""

from __future__ import annotations


class ProtocolError(Exception):
    """Bad bytes on the wire or on disk: a frame or message that cannot be decoded.

    Every decoder in :mod:`cluster.protocol` turns any malformed input into this one
    exception type (and nothing else), so callers can close and count the offending
    connection and carry on.
    """

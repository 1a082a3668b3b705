"""A distinct error log, after Aeron's ``DistinctErrorLog``: what ``cluster-tool errors``
shows.

A :class:`DistinctErrorLog` is a :class:`logging.Handler` for WARNING-or-worse records.
It keeps **one entry per distinct error**, with how many times it happened and when it
happened first and last, so that one misbehaving client repeating the same failure
10,000 times is one line with a count, not 10,000 lines pushing everything else out.

Two records are the same error when they have the same logger, the same level and the
same *normalised* text: the message (and, for a record with an exception, the exception's
type and message) with every run of digits replaced by ``#`` and every hexadecimal
number (``0x1f``, or 8 or more hex digits) by ``#x``.  So ``session 17 timed out after
10.2 s`` and ``session 4 timed out after 9.8 s`` are one entry, and so are the same
``bad frame from 127.0.0.1:50312`` from two client ports.  An entry keeps the text of its
**latest** occurrence (the numbers of the last time), cut to :data:`MAX_MESSAGE` characters.

Bounded whatever is logged: at most ``max_entries`` entries and ``max_bytes`` of text
(message, logger and key, plus a fixed overhead per entry).  When a new distinct error
does not fit, the entries seen least recently are evicted (and counted in
:attr:`DistinctErrorLog.evicted`); a repeat of a known error costs nothing.

The node installs one for its whole process at the start of ``main()`` (:func:`install`,
on the ``cluster`` logger, so every ``cluster.*`` logger's records reach it), before its
configuration is read, so its earliest warnings (the start-up checks) are in it; the
admin server uses that one, or, for a node started in-process without ``main()``
(tests), one of its own on the ``cluster`` logger while it runs (:func:`installed`).  Not
on the root logger: a handler there would make ``logging.basicConfig`` do nothing.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 500
MAX_BYTES = 1 << 20
MAX_MESSAGE = 8192
ENTRY_OVERHEAD = 160
"""Bytes counted per entry besides its text (the numbers, the key's tuple)."""

_HEX = re.compile(
    r"\b0x[0-9a-fA-F]+\b"  # 0x7f3a...
    r"|\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"  # ids, digests
)
_DIGITS = re.compile(r"\d+")


def normalise(text: str) -> str:
    """``text`` with its numbers masked: hex numbers become ``#x``, runs of digits ``#``."""
    return _DIGITS.sub("#", _HEX.sub("#x", text))


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


@dataclass
class ErrorEntry:
    """One distinct error: its latest text, how often and when."""

    level: str
    logger: str
    message: str
    count: int
    first_time: float
    last_time: float
    size: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The ``errors`` admin reply's record (``time`` is the last time, as before the
        log was distinct, for the console)."""
        return {
            "time": self.last_time,
            "first_time": self.first_time,
            "last_time": self.last_time,
            "count": self.count,
            "level": self.level,
            "logger": self.logger,
            "message": self.message,
        }


class DistinctErrorLog(logging.Handler):
    """WARNING-or-worse records, one entry per distinct error (see the module docstring)."""

    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        max_message: int = MAX_MESSAGE,
        level: int = logging.WARNING,
    ) -> None:
        super().__init__(level)
        if max_entries < 1 or max_bytes < 1 or max_message < 1:
            raise ValueError("the error log's limits must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_message = max_message
        self._entries: OrderedDict[tuple[str, str, str], ErrorEntry] = OrderedDict()
        """Least recently seen first."""
        self.bytes = 0
        self.evicted = 0
        """Distinct errors dropped to stay within the limits."""
        self.total = 0
        """Records taken, repeats included."""

    def __len__(self) -> int:
        return len(self._entries)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.add(record)
        except Exception:
            self.handleError(record)

    def add(self, record: logging.LogRecord) -> None:
        """Count ``record``: a new entry, or one more of a known one."""
        text = record.getMessage()
        message = text
        kind = ""
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            kind = f"{type(exc).__name__}: {exc}"
            message += "\n" + "".join(traceback.format_exception(exc)).rstrip()
        message = _cut(message, self.max_message)
        key_text = normalise(_cut(text, self.max_message))
        if kind:
            key_text += "\n" + normalise(_cut(kind, self.max_message))
        key = (record.name, record.levelname, key_text)
        when = record.created
        with self.lock or _NO_LOCK:
            self.total += 1
            entry = self._entries.get(key)
            if entry is not None:
                entry.count += 1
                entry.first_time = min(entry.first_time, when)
                entry.last_time = max(entry.last_time, when)
                self.bytes += len(message) - len(entry.message)
                entry.size += len(message) - len(entry.message)
                entry.message = message
                self._entries.move_to_end(key)
            else:
                size = ENTRY_OVERHEAD + len(message) + len(record.name) + len(key_text)
                entry = ErrorEntry(record.levelname, record.name, message, 1, when, when, size)
                self._entries[key] = entry
                self.bytes += size
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_entries or self.bytes > self.max_bytes
            ):
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.size
                self.evicted += 1

    def entries(self) -> list[ErrorEntry]:
        """A copy of the entries, the one seen least recently first."""
        with self.lock or _NO_LOCK:
            return [
                ErrorEntry(e.level, e.logger, e.message, e.count, e.first_time, e.last_time)
                for e in self._entries.values()
            ]

    def records(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The ``errors`` reply: the ``limit`` entries seen most recently (all with None),
        oldest first, as :meth:`ErrorEntry.as_dict`."""
        found = [e.as_dict() for e in self.entries()]
        if limit is not None:
            found = found[-limit:] if limit > 0 else []
        return found

    def clear(self) -> None:
        with self.lock or _NO_LOCK:
            self._entries.clear()
            self.bytes = 0


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()
_process_log: DistinctErrorLog | None = None
_process_logger: logging.Logger | None = None


def install(logger: logging.Logger | None = None) -> DistinctErrorLog:
    """The process's error log, attached to ``logger`` (the ``cluster`` logger by default)
    the first time; later calls return the same one.  Call it before anything logs."""
    global _process_log, _process_logger
    if _process_log is None:
        _process_log = DistinctErrorLog()
        _process_logger = logger or logging.getLogger("cluster")
        _process_logger.addHandler(_process_log)
    return _process_log


def installed() -> DistinctErrorLog | None:
    """The process's error log if :func:`install` was called, else None."""
    return _process_log


def uninstall() -> None:
    """Detach and forget the process's error log (tests)."""
    global _process_log, _process_logger
    if _process_log is not None and _process_logger is not None:
        _process_logger.removeHandler(_process_log)
    _process_log = _process_logger = None

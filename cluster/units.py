"""Units of the settings: durations (``10s``, ``200ms``, ``500us``, ``1m``; a bare number is
seconds) and sizes (``4096``, ``64KiB``, ``1MiB``), parsed and shown; integers, ports and
booleans, and the checks a setting's parser is built from (positive, not negative, or
off)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_DURATION_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB|k|m|g)?\s*$", re.IGNORECASE)
_SIZE_MULT = {
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 1000,
    "mb": 1000_000,
    "gb": 1000_000_000,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
}


def parse_duration_ns(text: str | int | float) -> int:
    """``'10s'`` -> 10_000_000_000; a bare number is seconds."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        return int(text * 1_000_000_000)
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 10s, 200ms, 500us)")
    value, unit = m.groups()
    return int(float(value) * _DURATION_NS[unit or "s"])


def format_duration(ns: int) -> str:
    for unit in ("h", "m", "s", "ms", "us"):
        mult = _DURATION_NS[unit]
        if ns >= mult and ns % mult == 0:
            return f"{ns // mult}{unit}"
    return f"{ns}ns"


def parse_size(text: str | int) -> int:
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64KiB, 1MiB)")
    value, unit = m.groups()
    return int(value) * _SIZE_MULT[(unit or "b").lower()]


def format_size(value: int) -> str:
    """``67108864`` -> ``64MiB`` (whole KiB, MiB or GiB; else bytes)."""
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= mult and value % mult == 0:
            return f"{value // mult}{unit}"
    return str(value)


# ---- the checks a setting's parser is built from


def or_off(parse: Callable[[Any], int]) -> Callable[[Any], int]:
    """A non-negative value, or 0 for ``0``, ``off`` or ``none``."""

    def check(text: Any) -> int:
        if isinstance(text, str) and text.strip().lower() in ("0", "off", "none", "no", "false"):
            return 0
        value = parse(text)
        if value < 0:
            raise ValueError(f"must not be negative, got {text!r}")
        return value

    return check


def show_or_off(show: Callable[[int], str]) -> Callable[[int], str]:
    return lambda value: show(value) if value else "off"


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def positive(parse: Callable[[Any], int]) -> Callable[[Any], int]:
    """``parse``, refusing a value that is not above 0."""

    def check(text: Any) -> int:
        value = parse(text)
        if value <= 0:
            raise ValueError(f"must be positive, got {text!r}")
        return value

    return check


def not_negative(parse: Callable[[Any], int]) -> Callable[[Any], int]:
    """``parse``, refusing a value below 0."""

    def check(text: Any) -> int:
        value = parse(text)
        if value < 0:
            raise ValueError(f"must not be negative, got {text!r}")
        return value

    return check


def parse_int(text: Any) -> int:
    if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def parse_port(text: Any) -> int:
    value = parse_int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"not a port: {text!r}")
    return value

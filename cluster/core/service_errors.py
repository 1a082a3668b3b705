"""What a member does when a service callback raises (sans-IO: it logs, and decides).

Every member applies the same committed entry to the same state, so a callback that
raises on one member raises on every member, at the same log position.  The
:class:`~cluster.core.service_container.ServiceContainer` catches the exception (any
``BaseException``: a ``SystemExit`` raised by a callback is the service's error like any
other) around each callback, moves on past the entry as if it had returned, and hands
the error to its :class:`ServiceErrorPolicy`:

- ``continue`` (``--on-service-error continue``, the default): the error is logged at
  ERROR, with its traceback the first time a *distinct* error is seen (the same
  callback, exception type and message with its numbers masked, as
  :func:`cluster.errorlog.normalise` masks them) and as one line, at most every
  :data:`REPEAT_LOG_INTERVAL_NS`, with how many times it happened since, after that; the
  member goes on.  The container counts it and, on the leader, tells the client whose
  message it was (a ``ServiceErrorEvent``).
- ``stop`` (``--on-service-error stop``): the error is logged at ERROR with its
  traceback and :class:`ServiceFailure` is raised, which the node turns into a stop with
  exit code 1.  A restart replays the same entry and stops again.

A ``MemoryError`` stops the member whatever the policy: it depends on the machine, not
on the log, so the other members may well have applied the entry whole.  ``on_start``
raising (the service cannot load its snapshot) always stops the member too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errorlog import normalise

log = logging.getLogger("cluster.service")

CONTINUE = "continue"
STOP = "stop"
POLICIES = (CONTINUE, STOP)

MAX_ERROR_MESSAGE = 1000
"""Characters of an exception's text sent to the client (``ServiceErrorEvent.message``)."""
REPEAT_LOG_INTERVAL_NS = 10_000_000_000
"""A distinct error seen again is logged (one line) at most this often."""
MAX_DISTINCT = 256
"""Distinct errors remembered; past it the oldest is forgotten (and logged in full again
if it comes back)."""


def error_type(exc: BaseException) -> str:
    """``ValueError`` for a builtin, ``mymod.MyError`` for anything else."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def error_text(exc: BaseException, limit: int = MAX_ERROR_MESSAGE) -> str:
    """``str(exc)``, cut to ``limit`` characters (and never raising)."""
    try:
        text = str(exc)
    except Exception:
        text = f"<{type(exc).__name__} whose str() raised>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ServiceFailure(Exception):
    """A service callback raised and this member stops (``--on-service-error stop``, a
    ``MemoryError``, or ``on_start``): the node ends with exit code 1.  ``error`` is the
    service's exception (also the ``__cause__``); the ERROR line naming it was logged
    when it was raised."""

    def __init__(self, callback: str, log_position: int, error: BaseException) -> None:
        self.callback = callback
        self.log_position = log_position
        self.error = error
        super().__init__(
            f"the service's {callback} raised {error_type(error)}: {error_text(error)} "
            f"at log position {log_position}"
        )


class _Seen:
    __slots__ = ("count", "last_logged_ns", "unlogged")

    def __init__(self, now_ns: int) -> None:
        self.count = 1
        self.unlogged = 0
        self.last_logged_ns = now_ns


class ServiceErrorPolicy:
    """``continue`` or ``stop`` (see the module docstring); :meth:`on_error` is called by
    the container with every exception a callback raised."""

    def __init__(self, policy: str = CONTINUE, clock_ns: Callable[[], int] | None = None) -> None:
        if policy not in POLICIES:
            choices = ", ".join(POLICIES)
            raise ValueError(f"not a service error policy: {policy!r} (one of {choices})")
        self.policy = policy
        self.stop = policy == STOP
        self.clock_ns = clock_ns or (lambda: 0)
        self._seen: dict[tuple[str, str, str], _Seen] = {}

    def on_error(
        self, callback: str, exc: BaseException, log_position: int, where: str = ""
    ) -> None:
        """Log ``exc`` (raised by ``callback`` on the entry ending at ``log_position``;
        ``where``: which session, say); raise :class:`ServiceFailure` to stop."""
        kind, text = error_type(exc), error_text(exc)
        what = f"the service's {callback} raised {kind}: {text} at log position {log_position}"
        if where:
            what += f" ({where})"
        if self.stop or isinstance(exc, MemoryError):
            why = "--on-service-error stop" if self.stop else "a MemoryError is not deterministic"
            log.error("%s; stopping this member (%s)", what, why, exc_info=exc)
            raise ServiceFailure(callback, log_position, exc) from exc
        now = self.clock_ns()
        key = (callback, kind, normalise(text))
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= MAX_DISTINCT:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = _Seen(now)
            log.error(
                "%s; the member goes on (--on-service-error continue): every member raises "
                "on this entry alike; the same error again is logged in one line",
                what,
                exc_info=exc,
            )
            return
        seen.count += 1
        seen.unlogged += 1
        if now - seen.last_logged_ns >= REPEAT_LOG_INTERVAL_NS:
            log.error(
                "%s again (%d times since the last report, %d in all)",
                what,
                seen.unlogged,
                seen.count,
            )
            seen.unlogged = 0
            seen.last_logged_ns = now

    def failed_to_start(self, exc: BaseException, log_position: int) -> ServiceFailure:
        """``on_start`` raised (the service could not load its state): the member
        cannot start, whatever the policy.  Logged; the caller raises what it returns."""
        log.error(
            "the service's on_start raised %s: %s at log position %d (it could not load "
            "its state); this member cannot start",
            error_type(exc),
            error_text(exc),
            log_position,
            exc_info=exc,
        )
        return ServiceFailure("on_start", log_position, exc)

"""Exception groups unwrapped for :func:`~client.connect`.

``connect`` runs the user's block inside the client's task group, so without this every
error (the user's own, a refusal, a timeout) would come out wrapped in an
``ExceptionGroup``; its docstring promises they never do.
"""

from __future__ import annotations

from typing import Any, NoReturn

import anyio

from .errors import ClusterClientError

__all__ = ["raise_unwrapped"]


def _reraise(exc: BaseException) -> NoReturn:
    """Raise ``exc`` again without chaining it to the group being handled."""
    __tracebackhide__ = True
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context


def _leaves(exc: BaseException, keep: BaseException | None) -> list[BaseException]:
    if exc is keep or not isinstance(exc, BaseExceptionGroup):
        return [exc]
    leaves: list[BaseException] = []
    for inner in exc.exceptions:
        leaves.extend(_leaves(inner, keep))
    return leaves


def raise_unwrapped(group: BaseExceptionGroup[Any], user_error: BaseException | None) -> NoReturn:
    """Turn a task group's ExceptionGroup back into the one exception that matters.

    Modelled on trio-websocket's ``open_websocket``: one exception is raised as itself;
    cancellations beside a real error are dropped; the user's own error wins over
    internal ones (which become its ``__context__``).
    """
    if group is user_error:
        _reraise(group)
    leaves = _leaves(group, user_error)
    if len(leaves) == 1:
        _reraise(leaves[0])
    cancelled = anyio.get_cancelled_exc_class()
    real = [exc for exc in leaves if not isinstance(exc, cancelled)]
    if not real:
        if user_error is not None and any(exc is user_error for exc in leaves):
            _reraise(user_error)
        _reraise(leaves[0])
    if len(real) == 1:
        _reraise(real[0])
    if any(isinstance(exc, KeyboardInterrupt) for exc in real):
        raise KeyboardInterrupt from group
    if user_error is not None and any(exc is user_error for exc in real):
        internal = [exc for exc in real if exc is not user_error]
        user_error.__context__ = BaseExceptionGroup("cluster client internal errors", internal)
        user_error.__suppress_context__ = False
        _reraise(user_error)
    raise ClusterClientError("the cluster client failed with several errors") from group

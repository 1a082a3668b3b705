"""The node's command line: ``python -m cluster.node`` (which runs this module) and
``cluster-node``.

Settings (:func:`cluster.config.load_config`), the service and authenticator classes,
the exposure check, the descriptor limit raised and the connection caps sized from it
(:func:`cluster.descriptors.fit_descriptors`), then :meth:`cluster.node.Node.run`, with
what ends it turned into an exit code: 0 a clean stop; 2 a mistake the operator can fix
(a setting, a port in use, a data directory of another member or held by another
process), with one line naming it; 1 anything else (a damaged archive, an unexpected
error, logged with its traceback; a service callback that raised with
``--on-service-error stop``, or an ``on_start`` that raised: one ERROR line naming the
callback, the log position and the exception, with the service's traceback, logged when
it happened).

The log goes to stderr, as text lines or, with ``--log-format json``, one JSON object a
line (:class:`JsonFormatter`); each ``CLUSTER_*`` environment variable that names no
setting gets one WARNING line at start-up (a misspelt one would be ignored otherwise).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import trio

from .archive.errors import ArchiveCorruptionError, ArchiveError
from .archive.identity import DataDirError
from .config import SETTINGS, ConfigError, NodeConfig, describe, load_config
from .core.service_errors import ServiceFailure
from .descriptors import fit_descriptors
from .memory import tune_allocator
from .node import Node
from .security import check_exposure, configure_logging, network_for
from .service import ClusteredService
from .transport.base import ListenError, listen_error_in

log = logging.getLogger("cluster.node")

CORRUPTION_REMEDY = (
    "this member's log holds other bytes than it wrote (a damaged disk: bit rot, a "
    "misdirected write), and nothing of it was applied or sent past that point; while "
    "the other members hold a quorum, move its --dir aside (keep it to look into) and "
    "start it on an empty one: its leader rebuilds it (docs/data-directory.md, "
    "'Replacing a failed member'); check the disk first"
)
"""What a member that finds its log corrupt at start-up tells the operator to do."""

OTHER_VARIABLES = frozenset(
    {
        "CLUSTER_CONFIG",  # --config
        "CLUSTER_CLIENT_CERTS_DIR",  # the tools' --certs-dir
        "CLUSTER_SECRETS_FILE",  # cluster.examples.auth
        "CLUSTER_CREDENTIALS",  # cluster-tui
        "CLUSTER_TUI_SCREENSHOT_DIR",
    }
)
"""``CLUSTER_*`` variables that are read, though not as a node's settings."""


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (UTC, ISO 8601, milliseconds), ``level``,
    ``logger``, ``member``, ``message`` and, when the record has one, ``exception`` (its
    traceback as text) and ``stack``."""

    def __init__(self, member_id: int) -> None:
        super().__init__()
        self.member_id = member_id

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "member": self.member_id,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(config: NodeConfig) -> None:
    """The node's log on stderr, at ``--log-level``, as ``--log-format`` says."""
    if config.log_format != "json":
        configure_logging(config.log_level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(config.member_id))
    logging.basicConfig(level=getattr(logging, config.log_level, logging.INFO), handlers=[handler])


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``CLUSTER_*`` variables of ``environ`` that are no setting (etcd warns of its
    ``ETCD_*`` ones alike)."""
    known = {"CLUSTER_" + s.name.replace("-", "_").upper() for s in SETTINGS}
    return sorted(
        name
        for name in environ
        if name.startswith("CLUSTER_") and name not in known and name not in OTHER_VARIABLES
    )


def warn_unknown_variables(names: Iterable[str]) -> None:
    for name in names:
        log.warning(
            "environment variable %s is not a setting and is ignored (settings: "
            "CLUSTER_ and the flag's name, e.g. CLUSTER_SESSION_TIMEOUT for "
            "--session-timeout)",
            name,
        )


def load_object(spec: str, what: str) -> Any:
    """Import ``module:Name`` and return the object, with a clear error if it fails."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"bad {what} {spec!r}: expected MODULE:CLASS")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(import_error(module_name, what, exc)) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what} {spec!r}: module has no attribute {attr!r}") from None


def import_error(module_name: str, what: str, exc: ImportError) -> str:
    """Why ``module_name`` did not import, for an operator: either it is nowhere on
    ``sys.path`` (the folders searched named, and ``PYTHONPATH``, the way to add one),
    or it was found and something it imports is missing."""
    missing = exc.name or module_name
    if missing != module_name and not module_name.startswith(missing + "."):
        return (
            f"{what} module {module_name!r} was found but does not import: {exc} "
            f"(is {missing!r} installed for {sys.executable}?)"
        )
    folders = [os.path.abspath(p or os.curdir) for p in sys.path]
    searched = [f for f in dict.fromkeys(folders) if os.path.isdir(f)]
    pythonpath = os.environ.get("PYTHONPATH")
    top = module_name.partition(".")[0]
    return (
        f"cannot import {what} module {module_name!r}: {exc}. Searched the folders "
        f"{', '.join(searched)} (the current folder first; "
        f"{'PYTHONPATH=' + pythonpath if pythonpath else 'PYTHONPATH is not set'}; then the "
        f"installed packages). Put the folder that holds {top}.py (or the package "
        f"{top}/) in PYTHONPATH, or start the node in it"
    )


def import_from_current_folder() -> None:
    """Put the current folder first on ``sys.path``, as ``python -m cluster.node`` does,
    so that ``--service mod:Class`` finds ``mod.py`` where the operator stands with
    ``cluster-node`` too (a console script's ``sys.path`` starts with the folder of the
    script instead).  ``python -P`` (``PYTHONSAFEPATH``) asks for no such entry, and
    gets none."""
    if sys.flags.safe_path:
        return
    here = os.getcwd()
    if all(os.path.abspath(p or os.curdir) != here for p in sys.path):
        sys.path.insert(0, here)


def _error(config: NodeConfig, message: str) -> None:
    """A start-up error of one line: ``error: ...`` in the text log, a record in json."""
    if config.log_format == "json":
        log.error("%s", message)
    else:
        print(f"error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    from .errorlog import install as install_error_log

    install_error_log()  # first: `cluster-tool errors` shows the start-up warnings too
    try:
        config = load_config(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config)
    warn_unknown_variables(unknown_variables(os.environ))
    import_from_current_folder()
    try:
        service_cls = load_object(config.service, "service")
        authenticator = (
            load_object(config.authenticator, "authenticator")() if config.authenticator else None
        )
        try:
            service = service_cls()
        except TypeError as exc:  # an abstract service: no on_take_snapshot/on_start
            raise ConfigError(f"service {config.service!r}: {exc}") from None
        if not isinstance(service, ClusteredService):
            raise ConfigError(f"service {config.service!r} is not a ClusteredService")
        check_exposure(config)
        network = network_for(config)
    except ConfigError as exc:
        _error(config, str(exc))
        return 2
    config = fit_descriptors(config)  # the soft limit raised, the caps sized from it
    log.info(
        "starting member %d (pid %d) with\n%s", config.member_id, os.getpid(), describe(config)
    )
    node = Node(config, service, authenticator=authenticator, network=network)
    tune_allocator()  # large short-lived buffers are mapped, not taken from the heap
    try:
        trio.run(partial(node.run, freeze_gc=True))
    except ServiceFailure:  # logged (with the service's traceback) where it was raised
        return 1
    except DataDirError as exc:
        log.error("cannot start: %s", exc)
        return 2
    except ArchiveCorruptionError as exc:
        log.error("cannot start: %s; %s", exc, CORRUPTION_REMEDY)
        return 1
    except ArchiveError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except ListenError as exc:  # before OSError, which it is: a port in use, named
        _error(config, str(exc))
        return 2
    except OSError as exc:
        log.error("node stopped: %s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # an ExceptionGroup from the agents' nursery, or any bug
        listen_error = listen_error_in(exc)
        if listen_error is not None:  # a port in use: one line naming it, no traceback
            _error(config, str(listen_error))
            return 2
        if isinstance(exc, BaseExceptionGroup) and exc.split(ServiceFailure)[1] is None:
            return 1  # a ServiceFailure in a task (a snapshot installed from the leader)
        log.error("node stopped by an unexpected error: %r", exc, exc_info=exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

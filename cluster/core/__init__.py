"""The sans-IO consensus core: pure, synchronous, deterministic (no trio, sockets, clocks
or files).  A shell builds a :class:`ConsensusModule`, feeds it messages and ticks with
the time as an argument, and carries out what :func:`drive` hands it.  The modules
behind this package are its parts (see ``ARCHITECTURE.md``)."""

from __future__ import annotations

from .base import ConsensusConfig as ConsensusConfig
from .base import ConsensusPort as ConsensusPort
from .base import EgressPort as EgressPort
from .base import Event as Event
from .base import LeaderReady as LeaderReady
from .base import RoleChanged as RoleChanged
from .base import StoragePort as StoragePort
from .consensus import ConsensusModule as ConsensusModule
from .driver import Shell as Shell
from .driver import drive as drive

__all__ = [
    "ConsensusConfig",
    "ConsensusModule",
    "ConsensusPort",
    "EgressPort",
    "Event",
    "LeaderReady",
    "RoleChanged",
    "Shell",
    "StoragePort",
    "drive",
]

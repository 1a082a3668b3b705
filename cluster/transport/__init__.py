"""Transports: the :class:`Network` interface, real TCP, batched frame I/O."""

from __future__ import annotations

from .base import Network, StreamHandler
from .framed import FrameWriter, Receiver
from .tcp import TcpNetwork

__all__ = ["FrameWriter", "Network", "Receiver", "StreamHandler", "TcpNetwork"]

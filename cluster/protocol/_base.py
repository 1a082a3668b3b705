"""Base class for every message: msgspec Struct, encoded as a MessagePack array.

Each concrete message has an integer ``tag`` equal to Aeron's SBE template id, so a
channel's messages form a tagged union decoded in one pass.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, array_like=True, gc=False):
    """Base of all wire messages (array-like, integer-tagged)."""

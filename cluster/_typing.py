"""Constrained integer types for wire messages (SBE's int32/int64 ranges)."""

from __future__ import annotations

from typing import Annotated

import msgspec

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]

"""How a node's process uses the C allocator, and gives memory back (glibc; elsewhere
these do nothing).

What was measured (issue 36): under a steady load whose state stopped growing, every
member's resident memory grew with the log it wrote (47 to 109 MB in 6 minutes at 425
puts/s: 0.75 byte per byte of log at first) and was never given back.  All of the
growth was in the main heap (``[heap]`` in ``/proc/PID/smaps``): Python's own object
arenas and the thread arenas stayed flat, and so did the live objects ``tracemalloc``
sees.  The cause was a read of 256 KiB from each busy socket: ``receive_some(n)``
allocates ``n`` bytes and shrinks the block to what arrived, so every read took a large
block from the heap, and the small objects allocated between two reads kept the heap
from shrinking again.  Reads now go into a buffer of each connection's own
(:class:`~cluster.transport.framed.Receiver`): the same load leaves a member flat at
about 51 MB.

What is here bounds the rest, for a node that owns its process (``cluster.launch``):

- :func:`tune_allocator` fixes glibc's mmap threshold at 128 KiB (its default).  Left
  alone, glibc raises the threshold each time a large mapped block is freed, up to
  32 MiB; from then on every large short-lived buffer (a snapshot being encoded, a MiB
  of log for a follower catching up, a TLS read, a frame being reassembled) comes from
  the heap, between long-lived small objects, and fragments it as the reads did.
  Fixed, such buffers are mapped and unmapped, and their memory goes back at once.
- :func:`give_back_memory` calls ``malloc_trim(0)`` every ``--memory-trim-interval``
  (30 s): the free pages inside the heap (what a burst left) go back to the system.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from typing import Any

import trio

log = logging.getLogger("cluster.node")

MMAP_THRESHOLD = 128 * 1024
"""Blocks of this size or more are mapped on their own (and unmapped when freed)."""
TRIM_INTERVAL = 30.0
"""Seconds between two ``malloc_trim`` calls."""
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # another C library (musl)
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


def tune_allocator() -> bool:
    """Fix the mmap threshold (see the module); False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim() -> bool:
    """Give the heap's free pages back to the system now; False if there were none (or
    the C library is not glibc)."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


async def give_back_memory(interval: float = TRIM_INTERVAL) -> None:
    """Trim the heap every ``interval`` seconds, for as long as the node runs.  A trim
    walks the heap's free blocks (about a millisecond for a heap of 60 MB here): one
    that takes longer than 20 ms is logged."""
    libc = _glibc()
    if libc is None:
        return
    while True:
        await trio.sleep(interval)
        started = time.perf_counter()
        libc.malloc_trim(0)
        took = time.perf_counter() - started
        if took > 0.02:
            log.info("giving back free memory took %.0f ms", took * 1000)

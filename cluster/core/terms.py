"""Term history: which leadership term wrote which byte range of the log.

Each term begins at a base position (where its leader appended its
NewLeadershipTermEvent) and owns the bytes up to the next term's base.  The term of the
entry that *ends* at position ``p`` is the last term whose base is below ``p``; two logs
whose terms agree there agree on everything before it (Raft's log matching property, in
byte positions).
"""

from __future__ import annotations

import bisect

NO_TERM = -1


class TermHistory:
    __slots__ = ("_bases", "_terms")

    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self._terms: list[int] = []
        self._bases: list[int] = []
        for term, base in sorted(entries or [], key=lambda e: (e[1], e[0])):
            self.append(term, base)

    def __len__(self) -> int:
        return len(self._terms)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(zip(self._terms, self._bases, strict=True))

    @property
    def last_term(self) -> int:
        return self._terms[-1] if self._terms else NO_TERM

    def append(self, term: int, base: int) -> None:
        """Record that ``term`` starts at ``base`` (terms and bases never go backwards)."""
        if self._terms:
            if term <= self._terms[-1]:
                raise ValueError(f"term {term} does not follow term {self._terms[-1]}")
            if base < self._bases[-1]:
                raise ValueError(f"term {term} base {base} precedes base {self._bases[-1]}")
        self._terms.append(term)
        self._bases.append(base)

    def term_at(self, position: int) -> int:
        """Term of the entry ending at ``position`` (-1 at 0 or before the first term)."""
        i = bisect.bisect_left(self._bases, position) - 1
        return self._terms[i] if i >= 0 else NO_TERM

    def base_of(self, term: int) -> int | None:
        try:
            return self._bases[self._terms.index(term)]
        except ValueError:
            return None

    def term_start_containing(self, position: int) -> int:
        """Base of the term that wrote the entry ending at ``position`` (0 if none)."""
        i = bisect.bisect_left(self._bases, position) - 1
        return self._bases[i] if i >= 0 else 0

    def next_base_after(self, position: int) -> int | None:
        """The first term base strictly after ``position``: where a chunk must stop."""
        i = bisect.bisect_right(self._bases, position)
        return self._bases[i] if i < len(self._bases) else None

    def term_for_data_at(self, position: int) -> tuple[int, int]:
        """``(term, base)`` of the term that owns the byte at ``position``."""
        i = bisect.bisect_right(self._bases, position) - 1
        if i < 0:
            return NO_TERM, 0
        return self._terms[i], self._bases[i]

    def truncate(self, position: int) -> list[int]:
        """Forget terms whose base is at or after ``position``; return their ids."""
        i = bisect.bisect_left(self._bases, position)
        removed = self._terms[i:]
        del self._terms[i:]
        del self._bases[i:]
        return removed

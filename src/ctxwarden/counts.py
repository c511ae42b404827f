"""An engine's in-process cache of token counts, read before the store's ``token_counts``.

Assembly looks up the counts of every related-block candidate and every message of the recent
history it walks (~150 rows at budget 4,000): one store statement and a
:class:`~ctxwarden.store.base.TokenCount` per row each time, ~0.5 ms of a 6.3 ms assembly. The
counts of a memory never change (its rendering is fixed by fields no write updates), so an
:class:`~ctxwarden.engine.Engine` keeps the ones it has read or made in a :class:`CountCache`
and asks the store only for the rest.

**Never a count for other text.** An entry is filed under a :func:`fingerprint`: a hash of the
tokenizer, the rowid and everything :func:`ctxwarden.render.message_text` and
:func:`~ctxwarden.render.line_text` read (the content itself, role, author, kind, creation time,
channel, the untrusted verdict, the attachments); a hit is served only when the count it finds
was also made for that rowid and tokenizer. So a rowid SQLite reuses after the last row is
erased, a memory re-ingested under an erased id with other text, a summary rebuilt with new
content, or rows another process (or server) wrote into the same database never meet a stale
entry: they miss, and the stale entry ages out. The id and content hash are not in it: they add
nothing to what is rendered (the content is hashed whole; ``content_hash`` is of the normalised
text, so two texts can share it). What may change on a stored row (an aggregate's ``dup_count``,
``last_seen_at`` and ``latest_content``; ``pinned``) is not in the counts: assembly counts an
aggregate's volume note when it renders it, and render reads ``kind``, never ``pinned``. A test
changes each field of a memory in turn and checks that whatever moves the rendered texts moves
the fingerprint.

The fingerprint is Python's ``hash`` of those fields (64 bits; SipHash keyed per process for
strings), so two renderings at one rowid share it at odds of about 2**-64. The cache holds no
text: fingerprints and counts only, so erased text does not stay alive in it (the engine also
empties it when it erases).

**Bounded**: at most ``size`` entries (:data:`COUNT_CACHE_SIZE`, 65,536; ``0`` turns it off),
the longest cached out first (a hit does not refresh its entry: that would cost a list move per
hit, and a count evicted while still in use is read from the store again). An entry is an
``OrderedDict`` slot, its integer key and a ``TokenCount``: about 300 bytes (tracemalloc, rowids
and counts past the small-int cache), so the default bound is ~20 MB per engine at most.

**Threads**: the HTTP server calls one engine from several threads. Each lookup or fill of a
batch holds one lock (tens of microseconds for 150 rows), and a hit is checked against the
count object it found, so no thread can be served a count made for other text. One race is the
store's, not the cache's: a count read from the store after another process replaced the row
read a moment before (same rowid) belongs to the new row, exactly as without the cache; the
cache files it under the old row's fingerprint, which the new row never matches.

It sits above the :class:`~ctxwarden.store.base.Store` protocol, so SQLite and PostgreSQL
behave alike.

How the engine uses it (``ctxwarden.counting.MemoryCounts.counts``)::

    found, missing = cache.lookup(memories, tok.name)
    read = store.token_counts([m.rowid for m in missing], tok.name)  # then count the rest
    cache.fill((m, read[m.rowid]) for m in missing)
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ctxwarden.errors import ConfigError
from ctxwarden.provenance import is_untrusted
from ctxwarden.store.base import TokenCount
from ctxwarden.types import Memory

__all__ = ["COUNT_CACHE_SIZE", "CountCache", "fingerprint"]

#: Default bound of an engine's count cache (entries; ~300 bytes each).
COUNT_CACHE_SIZE = 65536


def fingerprint(memory: Memory, tokenizer: str) -> int:
    """A hash of ``tokenizer``, the rowid and every field the rendered message and line of
    ``memory`` depend on: the key of its counts in a :class:`CountCache`.

    Two memories with the same fingerprint render to the same texts (up to a 2**-64 collision);
    add a field here whenever :mod:`ctxwarden.render` starts reading a new one for the counted
    texts.
    """
    metadata = memory.metadata
    return hash(
        (
            tokenizer,
            memory.rowid,
            memory.content,
            memory.role,
            memory.author,
            memory.kind,
            memory.created_at,
            memory.channel,
            bool(metadata) and is_untrusted(metadata),
            json.dumps(memory.attachments, sort_keys=True) if memory.attachments else None,
        )
    )


class CountCache:
    """Token counts by :func:`fingerprint` (checked against the rowid and tokenizer the count
    was made for); at most ``size`` entries, the oldest evicted first.

    >>> cache = CountCache(size=1000)
    >>> cache.lookup([], "o200k_base")
    ({}, [])
    """

    def __init__(self, size: int = COUNT_CACHE_SIZE) -> None:
        if size < 0:
            raise ConfigError(f"size: {size} is negative; pass 0 to cache nothing")
        self.size = size
        self._entries: OrderedDict[int, TokenCount] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, memories: Sequence[Memory], tokenizer: str
    ) -> tuple[dict[int, TokenCount], list[Memory]]:
        """The cached counts of ``memories`` under ``tokenizer`` (by rowid), and the memories
        missing (never cached, evicted, or cached for other text at their rowid)."""
        found: dict[int, TokenCount] = {}
        missing: list[Memory] = []
        with self._lock:
            get, miss = self._entries.get, missing.append
            for memory in memories:
                rowid = memory.rowid
                # One key function for lookup and fill: an inlined copy saved only a call per
                # memory, and had it drifted from fingerprint() every lookup would miss.
                count = get(fingerprint(memory, tokenizer))
                # The rowid and tokenizer checked too: two fingerprints of other rows may meet.
                if count is not None and count.rowid == rowid and count.tokenizer == tokenizer:
                    found[rowid] = count
                else:
                    miss(memory)
        return found, missing

    def fill(self, pairs: Iterable[tuple[Memory, TokenCount]]) -> None:
        """Cache each count for the memory it was read or counted for (under the count's
        tokenizer), then evict the oldest entries down to the bound."""
        if not self.size:
            return
        entries = self._entries
        with self._lock:
            for memory, count in pairs:
                key = fingerprint(memory, count.tokenizer)
                entries[key] = count
                entries.move_to_end(key)
            while len(entries) > self.size:
                entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry (the engine calls this when it erases memories)."""
        with self._lock:
            self._entries.clear()

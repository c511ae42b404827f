"""The token counts of stored memories as the engine's flows ask for them: from the
in-process :class:`~ctxwarden.counts.CountCache`, else the store, else counted now (and stored).

One :class:`MemoryCounts` per engine, shared by assembly (pinned, summaries, related lines and
the walk over recent history) and by compaction and window summaries, so a count made by one is
served to the others. Ingest counts only the tokenizers ``EngineConfig.tokenizers`` names; every
other count is made here on first use.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence

from ctxwarden import render, tokens
from ctxwarden.counts import CountCache, fingerprint
from ctxwarden.errors import StoreUnavailable
from ctxwarden.store.base import Store, TokenCount
from ctxwarden.types import Memory

__all__ = ["COUNT_WRITE_WAIT", "MemoryCounts"]

log = logging.getLogger(__name__)

#: The longest a count made on a request's path waits for the store's write lock (seconds).
#: Storing it is a cache write: when other processes' writers hold the file longer, it is
#: skipped and the memory counted again next time (~10 us a message), instead of the request
#: waiting up to the store's timeout (seconds, beside library writers: issue 20).
COUNT_WRITE_WAIT = 0.05


class MemoryCounts:
    """Counts of memories for a tokenizer, cached (``cache``) in front of the ``store``."""

    def __init__(self, store: Store, size: int) -> None:
        self.store = store
        # Token counts read or made here, checked against each memory's rendering inputs
        # (:mod:`ctxwarden.counts`): assembly asks the store only for the ones it lacks.
        self.cache = CountCache(size)
        # Counts of related-block lines (:func:`~ctxwarden.render.entry_text`), by the
        # memory's fingerprint (:func:`~ctxwarden.counts.fingerprint`: tokenizer, rowid and
        # every field rendered; like the count cache, it holds no text): not stored (the
        # store keeps the full line's count), counted on first use.
        self._entries: dict[int, int] = {}
        # Counts of other texts assembly counts each turn (a summary's lines offered as
        # passages), by tokenizer and a digest of the text: holds no text either.
        self._texts: dict[tuple[str, bytes], int] = {}
        self._size = max(1, size)

    def clear(self) -> None:
        """Forget every cached count (after an erasure: its rows' counts must not outlive it)."""
        self.cache.clear()
        self._entries.clear()
        self._texts.clear()

    def text_counter(self, tok: tokens.Tokenizer) -> Callable[[str], int]:
        """``tok.count`` with the counts kept in this process by a digest of the text, for
        texts that recur turn after turn without being memories of their own (a summary's
        lines: counting up to a hundred of them was most of what passages cost a turn)."""
        cache = self._texts
        name = tok.name

        def count(text: str) -> int:
            key = (
                name,
                hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest(),
            )
            value = cache.get(key)
            if value is None:
                if len(cache) >= self._size:
                    cache.clear()
                value = cache[key] = tok.count(text)
            return value

        return count

    def entries(self, memories: Sequence[Memory], tok: tokens.Tokenizer) -> dict[int, int]:
        """The token counts of these memories' related-block lines
        (:func:`~ctxwarden.render.entry_text`) by rowid: counted once per memory in this
        process (a few hundred a turn; the cache is emptied when it holds more than its size).
        The key is the memory's :func:`~ctxwarden.counts.fingerprint` (as the count cache's),
        so a rowid reused for other text (another writer) or an erased memory never meets a
        count made for other text; a hit renders nothing (rendering and hashing each line was
        ~1.3 ms of a turn's ~250 candidates, the fingerprints ~0.1 ms)."""
        out: dict[int, int] = {}
        cache = self._entries
        name = tok.name
        for memory in memories:
            key = fingerprint(memory, name)
            count = cache.get(key)
            if count is None:
                if len(cache) >= self._size:
                    cache.clear()
                count = cache[key] = tok.count(render.entry_text(memory))
            out[memory.rowid] = count
        return out

    def counts(self, memories: Sequence[Memory], tok: tokens.Tokenizer) -> dict[int, TokenCount]:
        """Counts for these memories by rowid: from the engine's count cache, else the store,
        else counted now (and stored); what came from the store or the tokenizer is cached."""
        counts = self.stored(memories, tok.name)
        missing = [m for m in memories if m.rowid not in counts]
        if missing:
            fresh = [
                TokenCount(
                    rowid=m.rowid,
                    tokenizer=tok.name,
                    message=tok.count(render.message_text(m)),
                    line=tok.count(render.line_text(m)),
                )
                for m in missing
            ]
            counts.update((c.rowid, c) for c in fresh)
            try:
                self.store.put_token_counts(fresh, wait=COUNT_WRITE_WAIT)
            except StoreUnavailable as exc:  # read-only, full or locked: counted again next time
                log.warning("token counts not cached: %s", exc)
            else:  # cached only once the store holds them too
                self.cache.fill(zip(missing, fresh, strict=True))
        return counts

    def stored(self, memories: Sequence[Memory], tokenizer: str) -> dict[int, TokenCount]:
        """The counts of these memories that the engine's count cache or the store holds, by
        rowid (what the store held is cached); memories neither holds are left out."""
        counts, unknown = self.cache.lookup(memories, tokenizer)
        if unknown:
            read = self.store.token_counts([m.rowid for m in unknown], tokenizer)
            counts.update(read)
            self.cache.fill((m, read[m.rowid]) for m in unknown if m.rowid in read)
        return counts

"""A session's history, newest first, as the recent block's candidates: pages of the store
joined into units (a tool call with its results), each priced with the model's chat format
from the token counts the engine's :class:`~ctxwarden.counting.MemoryCounts` holds or makes
(split from :mod:`ctxwarden.assembly`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ctxwarden import render, tokens
from ctxwarden.assemble import Candidate, memory_message
from ctxwarden.counting import COUNT_WRITE_WAIT, MemoryCounts
from ctxwarden.errors import StoreUnavailable
from ctxwarden.provenance import is_untrusted
from ctxwarden.store.base import Store, TokenCount
from ctxwarden.types import Memory

__all__ = ["TYPICAL_LINE_TOKENS", "RecentWalk"]

log = logging.getLogger(__name__)

#: The related-block line cost assumed before a session has history to measure: a chat line of
#: about 20 words with its ``[time] author:`` prefix.
TYPICAL_LINE_TOKENS = 32


class RecentWalk:
    """Newest-first pages of a session's history, joined into units (tool call + results)."""

    def __init__(
        self,
        store: Store,
        counter: MemoryCounts,
        page: int,
        tenant: str,
        session: str,
        channel: str | None,
        tok: tokens.Tokenizer,
        fmt: tokens.ChatFormat,
        user: str | None = None,
    ) -> None:
        self.store = store
        self.counter = counter
        self.page = page
        self.tenant = tenant
        self.session = session
        self.channel = channel
        self.user = user
        self.tok = tok
        self.fmt = fmt
        self._first_page: list[Memory] | None = None
        self._fresh: list[tuple[Memory, TokenCount]] = []
        self._line_tokens = 0  # line costs of the messages walked (for typical_line)
        self._lines = 0

    def _page(self, before: tuple[float, int] | None, limit: int) -> list[Memory]:
        return self.store.recent(
            self.tenant,
            self.session,
            channel=self.channel,
            before=before,
            limit=limit,
            user=self.user,
        )

    def peek_newest(self) -> Memory | None:
        if self._first_page is None:
            self._first_page = self._page(None, self.page)
        return self._first_page[0] if self._first_page else None

    def take(self, available: int) -> list[Candidate]:
        """Units newest first until their cost passes ``available`` (or history ends).

        Pages are sized from the average cost seen so far, so a large budget costs a few
        queries, and a store's size never matters: each page is an index range scan.
        """
        units: list[Candidate] = []
        total = 0
        pending: list[Memory] = []  # tool results waiting for the call that made them
        self.peek_newest()
        page = self._first_page or []
        limit = self.page
        while page:
            counts = self._page_counts(page)
            for memory in page:
                if memory.role == "tool":
                    pending.insert(0, memory)
                    continue
                group = (memory, *pending) if memory.tool_calls and pending else (memory,)
                pending = []
                unit = self._unit(group, counts)
                units.append(unit)
                total += unit.tokens
                if total >= available:
                    return units
            if len(page) < limit:
                break
            average = max(1.0, total / max(1, len(units)))
            limit = max(16, min(2000, int((available - total) / average * 1.2) + 8))
            last = page[-1]
            page = self._page((last.created_at, last.rowid), limit)
        return units

    def _page_counts(self, page: Sequence[Memory]) -> dict[int, TokenCount]:
        """The counts of a page the engine's cache or the store holds (the rest are counted by
        :meth:`_unit`, stored by :meth:`flush_counts`)."""
        return self.counter.stored(page, self.tok.name)

    def _unit(self, group: Sequence[Memory], counts: Mapping[int, TokenCount]) -> Candidate:
        texts = []
        cost = 0
        for memory in group:
            text = render.message_text(memory)
            if memory.dup_count > 1:
                text += render.volume_note(
                    memory.dup_count,
                    memory.created_at,
                    memory.last_seen_at,
                    memory.latest_content,
                    untrusted=is_untrusted(memory.metadata),
                )
            texts.append(text)
            cached = counts.get(memory.rowid)
            if cached is None:  # not counted yet (counts are made on first use): count, cache
                cached = TokenCount(
                    rowid=memory.rowid,
                    tokenizer=self.tok.name,
                    message=self.tok.count(render.message_text(memory)),
                    line=self.tok.count(render.line_text(memory)),
                )
                self._fresh.append((memory, cached))
            if memory.role != "tool" and not memory.tool_calls:  # never a related line
                self._line_tokens += cached.line
                self._lines += 1
            if memory.tool_calls or memory.role == "tool" or memory.dup_count > 1:
                message = memory_message(memory, text)
                cost += tokens.count_messages(
                    self.tok, self.fmt, [message]
                ) - self.fmt.request_overhead(has_system=False)
            else:
                role = render.replay_role(memory.role)
                cost += cached.message + self.fmt.message_overhead(role, name=memory.name)
        return Candidate(memories=tuple(group), tokens=cost, text="\x00".join(texts))

    def typical_line(self) -> float:
        """The mean related-block line cost of the messages :meth:`take` walked (this
        session's recent history, as far as the budget reaches; tool calls and results left
        out, as retrieval leaves them out), else :data:`TYPICAL_LINE_TOKENS`."""
        if not self._lines:
            return float(TYPICAL_LINE_TOKENS)
        return self._line_tokens / self._lines

    def flush_counts(self) -> StoreUnavailable | None:
        """Store the counts made during the walk, then cache them (after the store has them,
        so a count the cache serves is one the store holds too). A store that cannot be
        written now (read-only, full, locked: the error is returned) keeps none of them: they
        are counted again next time, and the assemble goes on."""
        fresh, self._fresh = self._fresh, []
        if not fresh:
            return None
        try:
            self.store.put_token_counts([c for _, c in fresh], wait=COUNT_WRITE_WAIT)
        except StoreUnavailable as exc:
            log.warning("token counts not cached: %s", exc)
            return exc
        self.counter.cache.fill(fresh)
        return None

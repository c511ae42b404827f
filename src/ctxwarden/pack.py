"""Lossless packs: a cluster whose facts cannot be summarised smaller becomes one summary that
keeps every message verbatim, with its id, time and author, when that saves a clear share of
the store.

A dense conversation (every turn a fact) cannot be summarised into fewer tokens without losing
what a question could ask for, and compaction leaves such clusters alone
(:func:`ctxwarden.compact.summarise_cluster`). Yet most of what a short message costs in a
store is not its text but its record: the row's fixed fields, one entry in each index of
``memories``, its full-text document and its token counts. A pack keeps the text and drops
the records: ``n`` rows become one, and each original leaves a content-free tombstone.

The store-cost model (:func:`store_saving`), in bytes, from the schema rather than from any
data set:

- ``ROW_BYTES`` (560): a memory beyond its text. Its row holds ~30 columns: ids, tenant,
  session, channel, author, kind and role strings (~60 bytes), six times and scores (8 bytes
  each), a 32-character content hash, a near-duplicate key, the record header (~200 bytes in
  all); each of the eight indexes of ``memories`` repeats its key columns (tenant, session,
  channel, kind or hash, a time) and the rowid (~40-45 bytes an entry, ~340); a token-count
  row and the full-text document-size row (~20-25).
- ``TEXT_FACTOR`` (2.0): a text byte is stored in the row and, as postings (a document id and
  a position per token of four to five bytes), about once more in the full-text index.
- ``TOMBSTONE_BYTES`` (60): what a compacted original leaves behind since tombstones are one
  row per summary (:mod:`ctxwarden.store.tombstones`): its id, 32-character hash and time
  range in the group's compressed list (~25-35 bytes), its 32-bit key row in
  ``tombstone_keys`` (~12) and its share of the group's shared columns (~64 a group); the
  store measures 49-52 bytes a retired id (docs/benchmarks.md), rounded up. (It was 140 with a
  row per id: tenant, id, deletion time, summary id, hash, time range and reason, ~100, and
  its entry in the tombstones' summary index, ~40.)

``min_pack_saving`` (:class:`~ctxwarden.compact.CompactionPolicy`, default 0.3) is the share
of its cluster's estimated bytes a pack must save. The estimate counts record bytes; pages hold
records at a fill between ln 2 (about 0.69, a B-tree after random inserts) and nearly 1 (after
VACUUM), so an estimate is uncertain by about 30 %: a pack that saves less might save nothing.
A message of ``t`` text bytes saves ``ROW_BYTES - TOMBSTONE_BYTES - TEXT_FACTOR x prefix``
(~460 bytes) of its ``ROW_BYTES + TEXT_FACTOR x t``, so clusters of messages under ~490 bytes
of text pack and clusters of long messages, whose text is most of their cost, do not.

A pack's lines are ``- [id] HH:MM author: text`` in input order under one ``Events:`` title:
the cheapest line that still says who said what, when, and where it came from. The time is
left out when the header states it exactly (every message in one minute) and carries the date
(``MM-DD HH:MM``) when the messages span several UTC days. A message that spans several lines
(code, a list) cannot be one line of a pack without losing its layout: a cluster holding one
is not packed.

What the store keeps (:attr:`Pack.stored`, metadata ``{PACK_FORMAT_KEY: PACK_FORMAT}``) is
only what the rest of the store does not already hold: the lines' ``author: text``, one a
line. The id of line ``n`` is the summary's ``source_ids[n]`` and its time the tombstone the
same compaction writes for that id (:mod:`ctxwarden.store.tombstones`, which keeps each
retired id's time range anyway); the header and the ``Events:`` title follow from those.
:func:`unpack` renders it again, byte for byte what :func:`pack` rendered, and the stores do
so on every read (:mod:`ctxwarden.store.pack_reads`), so nothing that shows a pack sees the
stored form. Storing ids and times a second time in the text cost ~14 tokens a LoCoMo line
(``- [D10:13] 13:56 ``): 38,860 tokens for 89,671 of messages (docs/benchmarks.md). A pack
whose ids repeat or whose messages lack a time is stored rendered, as are packs written before
this format (no format key: read as they are). Erasing an id drops line ``n`` with
``source_ids[n]`` (:func:`without_lines`); a pack erased down to other line times shows them
in the format its remaining lines call for.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ctxwarden.errors import StoreError
from ctxwarden.summary import Summary, SummaryItem, TokenCounter
from ctxwarden.types import format_time

__all__ = [
    "PACK_FORMAT",
    "PACK_FORMAT_KEY",
    "ROW_BYTES",
    "TEXT_FACTOR",
    "TOMBSTONE_BYTES",
    "Pack",
    "pack",
    "store_saving",
    "unpack",
    "without_lines",
]

ROW_BYTES = 560
TEXT_FACTOR = 2.0
TOMBSTONE_BYTES = 60

#: The metadata key that marks a summary stored in the pack format of this module (its value
#: :data:`PACK_FORMAT`); a summary without it is stored as it is shown (main's packs, whose
#: lines carry their ids and times, and every other summary).
PACK_FORMAT_KEY = "pack_format"
#: The stored format: one line per source, ``author: text``, in ``source_ids`` order.
PACK_FORMAT = 2


@dataclass(frozen=True, kw_only=True)
class Pack:
    """A cluster's lossless pack: its rendered ``text``, that text's ``tokens``, what the store
    keeps of it (``stored``: the lines without their ids and times, see the module doc; None
    when the pack must be stored as rendered) and the share of the cluster's estimated store
    bytes it saves (``saving``)."""

    text: str
    tokens: int
    saving: float
    stored: str | None = None


def store_saving(texts: Sequence[str], packed: str) -> float:
    """The share of the estimated store bytes of messages with ``texts`` that one summary
    with stored text ``packed`` (and a tombstone per message) saves (see the module doc).

    >>> round(store_saving(["x" * 100] * 10, "y" * 1200), 2)
    0.53
    """
    before = sum(ROW_BYTES + TEXT_FACTOR * len(t.encode("utf-8", "surrogatepass")) for t in texts)
    after = (
        ROW_BYTES
        + TEXT_FACTOR * len(packed.encode("utf-8", "surrogatepass"))
        + TOMBSTONE_BYTES * len(texts)
    )
    return 1.0 - after / before if before else 0.0


@functools.lru_cache(maxsize=8192)
def _minute(time: float) -> str:
    """``time`` to the minute (the stores render packs on every read: the same times again)."""
    return format_time(time, precision="minutes")


def _render(ids: Sequence[str], times: Sequence[float | None], rests: Sequence[str]) -> str:
    """The shown text of a pack whose line ``n`` is source ``ids[n]``, created at
    ``times[n]`` (None: unknown), saying ``rests[n]`` (``author: text``)."""
    known = [t for t in times if t is not None]
    minutes = [None if t is None else _minute(t) for t in times]
    stamps = {m for m in minutes if m is not None}
    one_minute = len(stamps) == 1 and len(known) == len(times)
    one_day = len({s[:10] for s in stamps}) <= 1
    lines = []
    for id_, stamp, rest in zip(ids, minutes, rests, strict=True):
        when = ""
        if stamp is not None and not one_minute:
            when = (stamp[11:16] if one_day else stamp[5:16].replace("T", " ")) + " "
        lines.append(f"[{id_}] {when}{rest}")
    start, end = (format_time(min(known)), format_time(max(known))) if known else (None, None)
    summary = Summary(
        time_range=None if start is None or end is None else (start, end),
        main_events=tuple(lines),
        source_ids=tuple(dict.fromkeys(ids)),
    )
    return summary.render()


def pack(items: Sequence[SummaryItem], tokenizer: TokenCounter) -> Pack | None:
    """The lossless pack of ``items`` (messages, in input order), or None when one of them
    spans several lines or is empty.

    >>> from ctxwarden.tokens import get_tokenizer
    >>> items = [SummaryItem(id="m1", content="Demo moved to Friday.", author="ana",
    ...                      created_at=0.0),
    ...          SummaryItem(id="m2", content="ok", author="bo", created_at=60.0)]
    >>> found = pack(items, get_tokenizer("cl100k_base"))
    >>> print(found.text)
    Summary of 2 messages, 1970-01-01 00:00-00:01 UTC
    Events:
    - [m1] 00:00 ana: Demo moved to Friday.
    - [m2] 00:01 bo: ok
    >>> print(found.stored)
    ana: Demo moved to Friday.
    bo: ok
    """
    if not items or any(
        item.kind != "message" or len(item.content.strip().splitlines()) != 1 for item in items
    ):
        return None
    ids = [item.id for item in items]
    times = [item.created_at for item in items]
    rests = [(f"{item.author}: " if item.author else "") + item.content.strip() for item in items]
    text = _render(ids, times, rests)
    # Stored without ids and times when the store holds them (source_ids in line order, one
    # tombstone time per id): every id once, every time known.
    compact = len(set(ids)) == len(ids) and all(t is not None for t in times)
    stored = "\n".join(rests) if compact else None
    saving = store_saving([item.content for item in items], text if stored is None else stored)
    return Pack(text=text, tokens=tokenizer.count(text), saving=saving, stored=stored)


def unpack(stored: str, ids: Sequence[str], times: Mapping[str, float]) -> str:
    """The shown text of a pack stored as ``stored`` (:attr:`Pack.stored`) with ``source_ids``
    ``ids``, the creation time of each source in ``times`` (from its tombstone): what
    :func:`pack` rendered. A source without a known time gets a line without one.

    :class:`~ctxwarden.errors.StoreError` when the lines and the ids disagree in number (a
    store written by other code: never shown misattributed).

    >>> print(unpack("ana: Demo moved to Friday.\\nbo: ok", ["m1", "m2"], {"m1": 0.0, "m2": 60.0}))
    Summary of 2 messages, 1970-01-01 00:00-00:01 UTC
    Events:
    - [m1] 00:00 ana: Demo moved to Friday.
    - [m2] 00:01 bo: ok
    """
    rests = stored.split("\n")
    if len(rests) != len(ids):
        raise StoreError(
            f"a lossless pack has {len(rests)} lines for {len(ids)} source ids: the store was "
            "written by other code; erase the summary or restore a backup"
        )
    return _render(ids, [times.get(i) for i in ids], rests)


def without_lines(
    stored: str, ids: Sequence[str], erased: Collection[str]
) -> tuple[str | None, list[str]]:
    """A stored pack (:attr:`Pack.stored`) and its ``source_ids`` without the lines of the
    ``erased`` ids: the stored text (None when no line is left) and the ids kept.

    >>> without_lines("ana: a\\nbo: b", ["m1", "m2"], {"m1"})
    ('bo: b', ['m2'])
    """
    rests = stored.split("\n")
    if len(rests) != len(ids):
        raise StoreError(
            f"a lossless pack has {len(rests)} lines for {len(ids)} source ids: the store was "
            "written by other code; erase the summary or restore a backup"
        )
    kept = [(i, rest) for i, rest in zip(ids, rests, strict=True) if i not in erased]
    if not kept:
        return None, []
    return "\n".join(rest for _, rest in kept), [i for i, _ in kept]

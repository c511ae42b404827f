"""keep_in_force (issue 19): the pure step of assembly that prefers what is in force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.assemble import Candidate, Material, keep_in_force
from ctxwarden.types import Memory

DAY = 86400.0


def _memory(rowid: int, content: str) -> Memory:
    return Memory(
        rowid=rowid, id=f"m{rowid}", tenant="default", session="s", channel=None,
        author="ana", author_kind="human", role="user", content=content,
        created_at=rowid * DAY, thread_id=None, reply_to=None, kind="message",
        pinned=False, name=None, tool_calls=(), tool_call_id=None,
        content_hash=f"hash{rowid}", dup_count=1, last_seen_at=rowid * DAY,
        access_count=0, last_accessed_at=None, access_score=0.0, included_tokens_total=0,
    )  # fmt: skip


def _cand(rowid: int, score: float) -> Candidate:
    return Candidate(memories=(_memory(rowid, f"text {rowid}"),), tokens=5, score=score)


def test_a_missing_successor_takes_the_superseded_hits_place() -> None:
    material = Material(count=len, related=[_cand(1, 0.9), _cand(2, 0.5)])
    successor = _cand(7, 0.0)
    notes = keep_in_force(material, {1: ("m7", 3 * DAY)}, {"m7": successor}, history=False)
    # The old hit stays right behind its successor, dated, for fill to leave out or show.
    assert [c.ids for c in material.related] == [("m7",), ("m1",), ("m2",)]
    assert material.related[0].score == 0.9
    old = material.related[1]
    assert old.text.endswith("(superseded on 1970-01-04)\n")
    assert old.superseded == (frozenset({7}), "m7", "1970-01-04")
    assert material.withheld == []
    assert notes == ["related: m7 (in force) put in place of m1, superseded on 1970-01-04"]


def test_a_successor_ranked_lower_moves_up() -> None:
    material = Material(count=len, related=[_cand(1, 0.9), _cand(2, 0.5), _cand(3, 0.2)])
    keep_in_force(material, {1: ("m3", 3 * DAY)}, {}, history=False)
    assert [c.ids for c in material.related] == [("m3",), ("m1",), ("m2",)]
    assert material.related[0].score == 0.9
    assert material.related[1].superseded == (frozenset({3}), "m3", "1970-01-04")


def test_a_chain_moves_up_its_newest_only() -> None:
    # m1 -> m2 -> m3: m2 is superseded too, so m3 is the one in force, in m2's place; m1 and
    # m2 stay dated, each left out when anything after it is chosen.
    material = Material(count=len, related=[_cand(1, 0.9), _cand(2, 0.5), _cand(3, 0.2)])
    keep_in_force(material, {1: ("m2", 2 * DAY), 2: ("m3", 3 * DAY)}, {}, history=False)
    assert [c.ids for c in material.related] == [("m3",), ("m2",), ("m1",)]
    marks = {c.ids[0]: c.superseded for c in material.related}
    assert marks["m3"] is None
    assert marks["m1"] == (frozenset({2, 3}), "m2", "1970-01-03")
    assert marks["m2"] == (frozenset({3}), "m3", "1970-01-04")


def test_fill_leaves_a_superseded_hit_out_only_when_its_successor_is_chosen() -> None:
    from ctxwarden.assemble import fill
    from ctxwarden.budget import Limits, chat_policy

    def related(budget: int) -> tuple[list[str], dict[str, str]]:
        # m7 (the successor) costs 40 tokens, m1 (superseded) 5.
        successor = Candidate(memories=(_memory(7, "new"),), tokens=40, score=0.0)
        material = Material(count=lambda text: 0, related=[_cand(1, 0.9)])
        keep_in_force(material, {1: ("m7", 3 * DAY)}, {"m7": successor}, history=False)
        limits = Limits(window=budget, reserve=0, margin=0, cap=budget)
        plan = fill(chat_policy(), limits, fixed=0, material=material)
        reasons = {r[0]: r[3] for r in plan.candidates}
        return [i for c in plan.chosen["related"] for i in c.ids], reasons

    chosen, reasons = related(1000)
    assert chosen == ["m7"]
    assert reasons["m1"] == "superseded by m7 (in this context) on 1970-01-04"
    chosen, reasons = related(30)  # no room for the successor: the old one, dated
    assert chosen == ["m1"]
    assert "dated: superseded by m7 on 1970-01-04" in reasons["m1"]


def test_history_keeps_the_old_hit_dated() -> None:
    material = Material(count=len, related=[_cand(1, 0.9), _cand(3, 0.2)])
    notes = keep_in_force(material, {1: ("m3", 3 * DAY)}, {}, history=True)
    assert [c.ids for c in material.related] == [("m3",), ("m1",)]
    dated = material.related[1]
    assert dated.text.endswith("(superseded on 1970-01-04)\n")
    assert dated.tokens == len(dated.text)
    assert material.withheld == []
    assert notes == ["m1: shown as history, superseded by m3 on 1970-01-04 "
                     "(the query asks what was in force before)"]  # fmt: skip


def test_nothing_superseded_changes_nothing() -> None:
    material = Material(count=len, related=[_cand(1, 0.9), _cand(2, 0.5)])
    assert keep_in_force(material, {}, {}, history=False) == []
    assert [c.ids for c in material.related] == [("m1",), ("m2",)]


@settings(max_examples=150, deadline=None)
@given(
    budget=st.integers(min_value=0, max_value=200),
    sizes=st.lists(st.integers(min_value=1, max_value=60), min_size=3, max_size=3),
    in_related=st.booleans(),
)
def test_a_superseded_hit_is_shown_dated_or_left_out_for_its_chosen_successor(
    budget: int, sizes: list[int], in_related: bool
) -> None:
    """For every budget: a superseded hit (m1 -> m7) is either left out with its successor
    chosen, or shown dated with its successor not chosen; never undated."""
    from ctxwarden.assemble import fill
    from ctxwarden.budget import Limits, chat_policy

    old = Candidate(memories=(_memory(1, "old"),), tokens=sizes[0], score=0.9)
    other = Candidate(memories=(_memory(2, "other"),), tokens=sizes[1], score=0.5)
    new = Candidate(memories=(_memory(7, "new"),), tokens=sizes[2], score=0.1)
    related = [old, other, new] if in_related else [old, other]
    material = Material(count=lambda text: sizes[0] + 1, related=related)
    successors = {} if in_related else {"m7": new}
    keep_in_force(material, {1: ("m7", 3 * DAY)}, successors, history=False)
    limits = Limits(window=budget, reserve=0, margin=0, cap=budget)
    plan = fill(chat_policy(), limits, fixed=0, material=material)
    chosen = {c.ids[0]: c for c in plan.chosen["related"]}
    reasons = {r[0]: r[3] for r in plan.candidates if not r[2]}
    if "m1" in chosen:  # shown: always dated
        assert chosen["m1"].text.endswith("(superseded on 1970-01-04)\n")
    elif "m7" in chosen:  # left out for its successor
        assert reasons["m1"] == "superseded by m7 (in this context) on 1970-01-04"
    else:  # neither: only for want of room, never for being superseded
        assert reasons["m1"] == "over the block's budget"


def test_a_superseded_pin_whose_successor_is_absent_stays_dated() -> None:
    material = Material(count=len, pinned=[_cand(1, 0.0), _cand(2, 0.0)])
    keep_in_force(material, {1: ("m9", 3 * DAY), 2: ("m1", 2 * DAY)}, {}, history=False)
    # m2's successor m1 is pinned: m2 leaves; m1's successor m9 is nowhere: m1 stays, dated.
    assert [c.ids for c in material.pinned] == [("m1",)]
    assert material.pinned[0].text.endswith("(superseded on 1970-01-04)\n")
    assert [c.ids for _, c, _ in material.withheld] == [("m2",)]

"""The entity signal's share (ctxwarden.entities): the check before each pattern's search
never changes a share."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.entities import entity_patterns, entity_share

# Texts that mix ASCII with the characters a case-insensitive search folds specially (the
# Kelvin sign, the long s, dotted and dotless i, the sharp s) and whitespace runs.
_ALPHABET = st.sampled_from(list("aAkKsSiIlLtT0123 .-_/\n\t\u212a\u017f\u0130\u0131\u00df"))
_WORD = st.text(_ALPHABET, min_size=1, max_size=6)


def _searched(query: str, text: str) -> float:
    patterns = entity_patterns(query)
    return sum(1 for p in patterns if p.search(text)) / len(patterns) if patterns else 0.0


@settings(max_examples=400, deadline=None)
@given(
    names=st.lists(st.sampled_from(["Lake Tahoe", "SSO", "v2.3", "Kai", "Ines Sa", "p99", "42"])),
    words=st.lists(_WORD, max_size=12),
)
def test_the_share_is_that_of_searching_every_pattern(names: list[str], words: list[str]) -> None:
    query = "Did we talk about " + ", ".join(f'"{n}"' if " " in n else n for n in names) + "?"
    text = " ".join(words + [n.lower() if i % 2 else n.upper() for i, n in enumerate(names[:2])])
    for candidate in (text, text.replace("k", "\u212a"), text.replace("s", "\u017f"), text.upper()):
        assert entity_share(entity_patterns(query), candidate) == _searched(query, candidate)


def test_a_name_split_by_other_whitespace_is_still_named() -> None:
    patterns = entity_patterns('Is "Lake Tahoe" near SSO?')
    assert entity_share(patterns, "we drove to lake\n\ttahoe") == 0.5
    assert entity_share(patterns, "lake is near tahoe") == 0.0
    assert entity_share(patterns, "sso and LAKE TAHOE") == 1.0

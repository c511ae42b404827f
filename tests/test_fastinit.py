"""fast_init: the swapped __init__ builds the same frozen objects as the dataclass's own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from ctxwarden._fastinit import fast_init
from ctxwarden.dedupe import DedupeCandidate, FoldDecision
from ctxwarden.fold import Analysed
from ctxwarden.store.base import Alias, FoldTarget, NewMemory
from ctxwarden.types import IngestOutcome, Record


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=list)
    d: int = field(default=4, kw_only=True)


@fast_init
@dataclass(frozen=True, slots=True)
class _Fast:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=list)
    d: int = field(default=4, kw_only=True)


def _values(obj: object) -> tuple[object, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))  # type: ignore[arg-type]


def test_same_signature_defaults_and_factories() -> None:
    assert _values(_Fast(1)) == _values(_Plain(1)) == (1, "b", [], 4)
    assert _values(_Fast(1, "x", [2], d=5)) == _values(_Plain(1, "x", [2], d=5))
    assert _values(_Fast(a=1, b="y")) == _values(_Plain(a=1, b="y"))
    assert _Fast(1).c is not _Fast(1).c  # a fresh default per instance
    with pytest.raises(TypeError):
        _Fast()
    with pytest.raises(TypeError):
        _Fast(1, "x", [2], 5)  # d is keyword-only
    with pytest.raises(TypeError):
        _Fast(1, e=2)


def test_still_frozen_equal_and_hashable() -> None:
    one = _Fast(1, "x", d=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 2  # type: ignore[misc]
    assert one == _Fast(1, "x", d=2)
    assert one != _Fast(2)
    assert repr(one) == "_Fast(a=1, b='x', c=[], d=2)"
    outcome = IngestOutcome(id="m", status="stored")
    assert hash(outcome) == hash(IngestOutcome(id="m", status="stored"))


def test_refuses_what_it_cannot_copy() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(TypeError):
        fast_init(NoSlots)


@pytest.mark.parametrize(
    "cls",
    [Record, IngestOutcome, NewMemory, FoldTarget, Alias, DedupeCandidate, FoldDecision, Analysed],
)
def test_ingest_types_use_it_and_set_every_field(cls: type) -> None:
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    first = dataclasses.fields(cls)[0].name
    assert f"_set_{first}" in cls.__init__.__code__.co_names
    fields = dataclasses.fields(cls)
    required = {
        f.name: f"v-{f.name}"
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    obj = cls(**required)
    for f in fields:
        expected = (
            required[f.name]
            if f.name in required
            else f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()  # type: ignore[misc]
        )
        assert getattr(obj, f.name) == expected
    assert obj == cls(**required)
    assert dataclasses.replace(obj) == obj


@fast_init
@dataclass(frozen=True, slots=True, kw_only=True)
class _Wide:
    a: int
    b: int = 2
    c: int = 3
    d: int = 4
    e: int = 5
    f: int = 6
    g: int = 7
    h: list[int] = field(default_factory=list)


def test_wide_classes_switch_to_a_twin_and_back() -> None:
    # Eight fields or more: the slots are written through a same-layout twin class.
    assert "_twin" in _Wide.__init__.__code__.co_names
    assert "_twin" in Record.__init__.__code__.co_names
    wide = _Wide(a=1, g=9)
    assert type(wide) is _Wide
    assert _values(wide) == (1, 2, 3, 4, 5, 6, 9, [])
    assert wide.h is not _Wide(a=1).h
    with pytest.raises(dataclasses.FrozenInstanceError):
        wide.a = 2  # type: ignore[misc]
    assert wide == _Wide(a=1, g=9)
    assert dataclasses.replace(wide, b=7) == _Wide(a=1, b=7, g=9)


def test_subclass_instances_keep_their_class() -> None:
    class Sub(_Wide):  # inherits the swapped __init__, which must not switch its class
        __slots__ = ()

    sub = Sub(a=1, c=5)
    assert type(sub) is Sub
    assert _values(sub) == (1, 2, 5, 4, 5, 6, 7, [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.a = 2  # type: ignore[misc]

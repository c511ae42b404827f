"""A cheaper ``__init__`` for the frozen, slotted dataclasses that ingest makes per record.

A frozen dataclass's generated ``__init__`` assigns each field through ``object.__setattr__``
(a generic attribute lookup per field, to get past its own ``__setattr__`` that refuses writes):
about 2.5 times the cost of a plain slotted class. Ingest builds several such objects per message
(a record of 18 fields, its new memory of 22, its de-dup candidate, its outcome), so that cost
was several microseconds of each message's budget. :func:`fast_init` swaps in an ``__init__``
with the same signature (keyword-only or not, defaults, default factories) that assigns the slots
without the frozen ``__setattr__``. The instances are the same objects: still frozen, same
equality, hash and repr.

How it assigns: the instance is switched for the duration of ``__init__`` to a *twin* class, a
plain slotted class with the same slots (so the same memory layout, which is what allows
``__class__`` assignment), whose ordinary attribute stores the interpreter specialises to a
direct slot write; then it is switched back. All values (default factories included) are
computed before the switch, and a slot write cannot fail, so no half-built object escapes in
the twin's clothes. Instances of a subclass, or of a class whose layout the twin cannot match,
are set through each slot's descriptor instead, and so are classes of fewer than eight fields:
the two switches (~0.1 us each) cost about what they save there. (Record, 18 fields: ~1.3 us
against ~2.2 us through the descriptors, measured at load ~8.)

Why it stays (issue 17 asked for plain Python unless a whole ingest shows the difference):
``bench/ingest.py --compare 4`` (100k messages, plain and fast processes alternating, load ~1.1)
gave 37.0 CPU us per message with it against 39.9 without (medians; runs 36.4-37.3 against
39.3-42.3, every pair in its favour): 7 % of the whole ingest. This decorator is the one seam: the
classes it is applied to behave identically without it (``bench/ingest.py --plain-init`` runs
ctxwarden with a no-op in its place), and ``tests/test_fastinit.py`` checks that equivalence.

>>> from dataclasses import dataclass, field
>>> @fast_init
... @dataclass(frozen=True, kw_only=True, slots=True)
... class Point:
...     x: int
...     tags: list[str] = field(default_factory=list)
>>> Point(x=1)
Point(x=1, tags=[])
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")

_FACTORY = object()  # marks "not given" for a field with a default factory
#: Below this many fields the two class switches (~0.1 us each) cost more than they save.
_TWIN_MIN_FIELDS = 8


def fast_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of frozen, slotted dataclass ``cls`` (see the module docstring)."""
    params = dataclasses.fields(cls)  # type: ignore[arg-type]
    if (
        not dataclasses.is_dataclass(cls)
        or "__slots__" not in cls.__dict__
        or hasattr(cls, "__post_init__")
        or any(not f.init for f in params)
    ):
        raise TypeError(f"fast_init: {cls.__name__} must be a slotted dataclass, all fields init")
    twin = _twin(cls) if len(params) >= _TWIN_MIN_FIELDS else None
    namespace: dict[str, Any] = {
        "_new_factory": _FACTORY,
        "_cls": cls,
        "_twin": twin,
        # The descriptor's own setter: no attribute lookup through the type on each switch.
        "_set_class": object.__dict__["__class__"].__set__,
    }
    positional: list[str] = []
    keyword: list[str] = []
    prepare: list[str] = []  # default factories, run before any slot is written
    stores: list[str] = []  # through the twin's plain slot writes
    sets: list[str] = []  # through the descriptors (subclasses)
    for f in params:
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            spec = f"{f.name}=_default_{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            spec = f"{f.name}=_new_factory"
            prepare.append(
                f"    if {f.name} is _new_factory:\n        {f.name} = _factory_{f.name}()"
            )
        else:
            spec = f.name
        (keyword if f.kw_only else positional).append(spec)
        stores.append(f"        self.{f.name} = {f.name}")
        sets.append(f"        _set_{f.name}(self, {f.name})")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    lines = [f"def __init__({signature}):", *prepare]
    if twin is not None:
        lines += [
            "    if type(self) is _cls:",
            "        _set_class(self, _twin)",
            *stores,
            "        _set_class(self, _cls)",
            "    else:",
            *sets,
        ]
    else:
        lines += ["    if True:", *(sets or ["        pass"])]
    source = "\n".join(lines) + "\n"
    # The source is built from the field names only, as dataclasses itself builds __init__.
    exec(source, namespace)  # noqa: S102
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def _twin(cls: type) -> type | None:
    """A plain slotted class laid out like ``cls`` (see the module docstring), or None when an
    instance of ``cls`` cannot be switched to it and back."""
    if cls.__bases__ != (object,):
        return None
    slots = cls.__dict__["__slots__"]
    twin = type(f"_{cls.__name__}Init", (), {"__slots__": slots, "__module__": cls.__module__})
    probe: object = object.__new__(cls)
    try:
        object.__setattr__(probe, "__class__", twin)
        object.__setattr__(probe, "__class__", cls)
    except TypeError:
        return None
    return twin

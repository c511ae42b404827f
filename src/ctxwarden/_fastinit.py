"""A cheaper ``__init__`` for the frozen, slotted dataclasses that ingest makes per record.

A frozen dataclass's generated ``__init__`` assigns each field through ``object.__setattr__``
(a generic attribute lookup per field, to get past its own ``__setattr__`` that refuses writes):
about 2.5 times the cost of a plain slotted class. Ingest builds several such objects per message
(a record of 18 fields, its new memory of 22, its de-dup candidate, its outcome), so that cost
was several microseconds of each message's budget. :func:`fast_init` swaps in an ``__init__``
with the same signature (keyword-only or not, defaults, default factories) that assigns through
each slot's own descriptor. The instances are the same objects: still frozen, same equality,
hash and repr.

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
    namespace: dict[str, Any] = {"_new_factory": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in params:
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            spec = f"{f.name}=_default_{f.name}"
            value = f.name
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            spec = f"{f.name}=_new_factory"
            value = f"_factory_{f.name}() if {f.name} is _new_factory else {f.name}"
        else:
            spec = value = f.name
        (keyword if f.kw_only else positional).append(spec)
        body.append(f"    _set_{f.name}(self, {value})")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]) + "\n"
    # The source is built from the field names only, as dataclasses itself builds __init__.
    exec(source, namespace)  # noqa: S102
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls

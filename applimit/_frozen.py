"""``fast_constructor``: a frozen slots dataclass built without a call per field.

A frozen dataclass' ``__init__`` sets each field through ``object.__setattr__``, a call
per field, and the hot path builds such objects for every decision (``LimitResult`` and
``Decision``, the ``DecisionEvent`` an observer hears, the ``RequestInfo`` a middleware
reads). :func:`fast_constructor` makes, once per class, a plain class with the same slots
whose ``__init__`` stores each field (a slot write, no call) and then switches the
instance's class to the frozen one, which Python allows between classes of one slot
layout: the object is then an instance of the frozen class like any other, frozen to
everyone (docs/benchmarks-compare.md, "Why each speed trick stays"). The ``__init__`` is
generated from the class' fields, so no field can be forgotten. Interpreted only: a class
compiled by mypyc cannot be switched.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar, cast

_T = TypeVar("_T")


def fast_constructor(cls: type[_T]) -> type[_T]:
    """What builds ``cls(*fields)`` (every field given, in order) faster: to the type
    checker ``cls`` itself. ``cls`` is a frozen dataclass with slots."""
    names = [field.name for field in dataclasses.fields(cast(Any, cls))]
    slots = tuple(getattr(cls, "__slots__", ()))
    if slots != tuple(names):
        raise TypeError(f"{cls.__name__} is not a slots dataclass whose slots are its fields")
    stores = "".join(f"    self.{name} = {name}\n" for name in names)
    source = f"def __init__(self, {', '.join(names)}):\n{stores}    self.__class__ = cls\n"
    namespace: dict[str, Any] = {"cls": cls}
    exec(source, namespace)  # noqa: S102 (made here from the class' own field names)
    twin = type(
        f"_{cls.__name__}Slots", (), {"__slots__": slots, "__init__": namespace["__init__"]}
    )
    return cast(type[_T], twin)

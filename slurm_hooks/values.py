"""``dataclass`` for the node's hot path: the same classes, made without ``exec``.

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``
and, frozen, ``__setattr__``/``__delattr__`` as source text and compiles it: about 1 ms per
class, paid at import by every health check and prolog (30 classes on that path). This decorator
gives a class the same fields (``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass``
work on it unchanged) with generic methods that read the field list, so defining one costs
microseconds. Options: ``frozen``, ``eq``, ``repr``; fields from :func:`dataclasses.field`
(``default``, ``default_factory``, ``init``, ``repr``, ``compare``, ``hash``); ``__post_init__``;
inherited fields. Anything else falls back to :func:`dataclasses.dataclass` itself.

:func:`compile_later` is the same idea for regular expressions: compiled on first use, not at import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, Field, FrozenInstanceError, field
from typing import Any

__all__ = ["compile_later", "dataclass", "field"]

_OPTIONS = {"frozen", "eq", "repr", "init"}


def dataclass(cls: type | None = None, /, **options: Any) -> Any:
    """Drop-in for :func:`dataclasses.dataclass` with the options above."""
    if set(options) - _OPTIONS or options.get("init") is False:
        return dataclasses.dataclass(cls, **options) if cls is not None else dataclasses.dataclass(**options)

    def wrap(c: type) -> type:
        return _make(c, frozen=bool(options.get("frozen", False)), eq=bool(options.get("eq", True)),
                     with_repr=bool(options.get("repr", True)))

    return wrap if cls is None else wrap(cls)


def _make(cls: type, *, frozen: bool, eq: bool, with_repr: bool) -> type:
    fields: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        fields.update(getattr(base, "__dataclass_fields__", {}))
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")):
            return dataclasses.dataclass(cls, frozen=frozen, eq=eq, repr=with_repr)  # not needed on the hot path
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else field(default=value)
        f.name, f.type = name, annotation
        f._field_type = dataclasses._FIELD  # what dataclasses.fields() lists
        if isinstance(value, Field):
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        fields[name] = f
    init = tuple((f.name, f.default, f.default_factory) for f in fields.values() if f.init)
    for i, (name, default, factory) in enumerate(init):
        if default is MISSING and factory is MISSING and any(d is not MISSING or fa is not MISSING
                                                               for _, d, fa in init[:i]):
            raise TypeError(f"non-default argument {name!r} follows default argument")
    later = tuple((f.name, f.default, f.default_factory) for f in fields.values() if not f.init)
    shown = tuple(f.name for f in fields.values() if f.repr)
    compared = tuple(f.name for f in fields.values() if f.compare)
    hashed = tuple(f.name for f in fields.values() if (f.compare if f.hash is None else f.hash))
    own = cls.__dict__
    explicit_hash = own.get("__hash__") is not None

    def put(name: str, fn: Any) -> None:  # as dataclasses: a method the class writes itself stays
        if name not in own:
            setattr(cls, name, fn)

    cls.__dataclass_fields__ = fields
    put("__match_args__", tuple(name for name, _, _ in init))
    put("__init__", _init(cls, init, later))
    if with_repr:
        put("__repr__", _repr(shown))
    if eq:
        put("__eq__", _eq(compared))
        if frozen and not explicit_hash:
            cls.__hash__ = _hash(hashed)
        elif not explicit_hash:
            cls.__hash__ = None  # as dataclasses: mutable and compared by value, so not hashable
    if frozen:
        if "__setattr__" in own or "__delattr__" in own:
            raise TypeError(f"cannot overwrite __setattr__/__delattr__ in frozen class {cls.__qualname__}")
        cls.__setattr__ = _frozen_setattr(cls, set(fields))
        cls.__delattr__ = _frozen_delattr(cls, set(fields))
    return cls


def _init(cls: type, init: tuple, later: tuple):
    qual = cls.__qualname__
    assign = object.__setattr__
    has_post = hasattr(cls, "__post_init__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and len(args) == len(init) and not later and not has_post and type(self) is cls:
            # the common call, all positional (a subclass may add __post_init__: the long way)
            for (name, _, _), value in zip(init, args):
                assign(self, name, value)
            return
        if len(args) > len(init):
            raise TypeError(f"{qual}.__init__() takes {len(init) + 1} positional arguments but "
                            f"{len(args) + 1} were given")
        for i, (name, default, factory) in enumerate(init):
            if i < len(args):
                if name in kwargs:
                    raise TypeError(f"{qual}.__init__() got multiple values for argument {name!r}")
                value = args[i]
            elif name in kwargs:
                value = kwargs.pop(name)
            elif factory is not MISSING:
                value = factory()
            elif default is not MISSING:
                value = default
            else:
                raise TypeError(f"{qual}.__init__() missing required argument: {name!r}")
            assign(self, name, value)
        if kwargs:
            raise TypeError(f"{qual}.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")
        for name, default, factory in later:
            if factory is not MISSING:
                assign(self, name, factory())
            elif default is not MISSING:
                assign(self, name, default)
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    __init__.__qualname__ = f"{qual}.__init__"
    return __init__


def _repr(shown: tuple[str, ...]):
    def __repr__(self) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

    return __repr__


def _eq(compared: tuple[str, ...]):
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in compared)

    return __eq__


def _hash(hashed: tuple[str, ...]):
    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in hashed))

    return __hash__


def _frozen_setattr(cls: type, names: set[str]):
    def __setattr__(self, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr(cls: type, names: set[str]):
    def __delattr__(self, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__


class compile_later:  # named as a function: it stands where re.compile stood
    """``re.compile(source, flags)`` done on first use: a module's patterns cost ~0.1-0.5 ms each to
    compile, paid by every health check and prolog at import though a healthy run uses few of them.
    Attributes (``match``, ``search``, ``sub``, ``pattern``, ...) are the compiled pattern's."""

    __slots__ = ("_source", "_flags", "_compiled")

    def __init__(self, source: str | bytes, flags: int = 0) -> None:
        self._source, self._flags, self._compiled = source, flags, None

    def __getattr__(self, name: str) -> Any:
        compiled = self._compiled
        if compiled is None:
            import re

            compiled = self._compiled = re.compile(self._source, self._flags)
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"compile_later({self._source!r}, {self._flags!r})"

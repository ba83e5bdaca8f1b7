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

:func:`setting` declares a config key on the field of its section's class (:mod:`slurm_hooks.config.sections`):
its default, the values it can take (a :class:`Range` of numbers or a tuple of ``choices``) and what it does
(``doc``, one line): :mod:`slurm_hooks.config` checks a file against them, ``tools/gen_config_doc.py`` writes
the example config and docs/configuration.md from them. The TOML types a key accepts follow from the field's
declared type (``float``: any number, kept as a float; ``tuple[str, ...]``: a list, kept as a tuple;
``dict[str, str]``: a table). It lives here, not in the config package, because ``models`` declares
``[expect]``'s keys with it and the config package depends on ``models``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~3 ms to import: only checkers read these names
    from typing import Any

__all__ = ["MISSING", "POSITIVE", "Range", "asdict", "compile_later", "dataclass", "field", "fields",
           "is_dataclass", "replace", "setting"]

_OPTIONS = {"frozen", "eq", "repr", "init"}


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: No default (this module's own: :mod:`dataclasses` is not imported until something asks for it).
MISSING: Any = _Missing()


class Field:
    """A field of a class made here: what :func:`dataclasses.field` records, without importing dataclasses
    (``dataclasses.fields()`` on the class gives real :class:`dataclasses.Field` objects, made then)."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare", "metadata")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING, init: bool = True, repr: bool = True,
                 hash: bool | None = None, compare: bool = True, metadata: Any = None) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name: str = ""
        self.type: Any = None
        self.default, self.default_factory, self.init, self.repr = default, default_factory, init, repr
        self.hash, self.compare, self.metadata = hash, compare, metadata

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, default_factory={self.default_factory!r})"


def field(*, default: Any = MISSING, default_factory: Any = MISSING, init: bool = True, repr: bool = True,
          hash: bool | None = None, compare: bool = True, metadata: Any = None) -> Any:
    """As :func:`dataclasses.field` (without ``kw_only``)."""
    return Field(default, default_factory, init, repr, hash, compare, metadata)


def _from_dataclasses(f: Any) -> Field:
    """One of :mod:`dataclasses`' own fields (a base made by it, or ``dataclasses.field()``) as ours."""
    dc = sys.modules["dataclasses"]
    out = Field(MISSING if f.default is dc.MISSING else f.default,
                MISSING if f.default_factory is dc.MISSING else f.default_factory,
                f.init, f.repr, f.hash, f.compare, f.metadata or None)
    out.name, out.type = f.name, f.type
    return out


def _to_dataclasses(f: Field) -> Any:
    import dataclasses

    real = dataclasses.field(default=dataclasses.MISSING if f.default is MISSING else f.default,
                             default_factory=dataclasses.MISSING if f.default_factory is MISSING else f.default_factory,
                             init=f.init, repr=f.repr, hash=f.hash, compare=f.compare, metadata=f.metadata)
    real.name, real.type = f.name, f.type
    real._field_type = dataclasses._FIELD  # what dataclasses.fields() lists
    return real


class _FieldsOnDemand:
    """``__dataclass_fields__`` of a class made here: real :class:`dataclasses.Field` objects, made (and
    dataclasses imported) the first time something reads it -- ``dataclasses.fields``, ``replace``,
    ``asdict``, ``is_dataclass`` -- then kept on the class in its place."""

    __slots__ = ("_cls",)

    def __init__(self, cls: type) -> None:
        self._cls = cls

    def __get__(self, instance: Any, owner: Any = None) -> dict[str, Any]:
        cls = self._cls
        real = {name: _to_dataclasses(f) for name, f in cls.__dict__["_values_fields"].items()}
        type.__setattr__(cls, "__dataclass_fields__", real)
        return real


def _is_dc_field(value: Any) -> bool:
    dc = sys.modules.get("dataclasses")
    return dc is not None and isinstance(value, dc.Field)


def _with_dataclasses(cls: type | None, **options: Any) -> Any:
    """:func:`dataclasses.dataclass` itself, for what this module does not do (our fields made theirs)."""
    import dataclasses

    def make(c: type) -> type:
        for name in c.__dict__.get("__annotations__", {}):
            value = c.__dict__.get(name)
            if isinstance(value, Field):
                value.name = name
                setattr(c, name, _to_dataclasses(value))
        return dataclasses.dataclass(c, **options)

    return make if cls is None else make(cls)


def dataclass(cls: type | None = None, /, **options: Any) -> Any:
    """Drop-in for :func:`dataclasses.dataclass` with the options above."""
    if set(options) - _OPTIONS or options.get("init") is False:
        return _with_dataclasses(cls, **options)

    def wrap(c: type) -> type:
        return _make(c, frozen=bool(options.get("frozen", False)), eq=bool(options.get("eq", True)),
                     with_repr=bool(options.get("repr", True)))

    return wrap if cls is None else wrap(cls)


def _base_fields(base: type) -> dict[str, Field]:
    own = base.__dict__.get("_values_fields")
    if own is not None:
        return own
    theirs = base.__dict__.get("__dataclass_fields__")
    if not theirs:
        return {}
    dc = sys.modules["dataclasses"]  # a base made by dataclasses itself: it is loaded
    return {n: _from_dataclasses(f) for n, f in theirs.items() if f._field_type is dc._FIELD}


def _make(cls: type, *, frozen: bool, eq: bool, with_repr: bool) -> type:
    own = cls.__dict__
    annotations = own.get("__annotations__", {})
    if annotations and "Var" in " ".join(map(str, annotations.values())) and \
            any(str(a).startswith(_NOT_HERE) for a in annotations.values()):
        return _with_dataclasses(cls, frozen=frozen, eq=eq, repr=with_repr)  # not needed on the hot path
    fields: dict[str, Field] = {}
    for base in cls.__mro__[-2:0:-1]:  # its bases, farthest first (object has no fields)
        fields.update(_base_fields(base))
    for name, annotation in annotations.items():
        value = own.get(name, MISSING)
        if value.__class__ is Field:
            f = value
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        elif _is_dc_field(value):
            f = _from_dataclasses(value)
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = Field(value)
        f.name, f.type = name, annotation
        fields[name] = f
    # one pass over the fields (this runs for every class on the hot path at each start)
    init, later, names, shown, compared, hashed = [], [], [], [], [], []
    seen_default = False
    for f in fields.values():
        name = f.name
        if f.init:
            if f.default is MISSING and f.default_factory is MISSING:
                if seen_default:
                    raise TypeError(f"non-default argument {name!r} follows default argument")
            else:
                seen_default = True
            init.append((name, f.default, f.default_factory))
            names.append(name)
        else:
            later.append((name, f.default, f.default_factory))
        if f.repr:
            shown.append(name)
        if f.compare:
            compared.append(name)
        if f.compare if f.hash is None else f.hash:
            hashed.append(name)
    init, later = tuple(init), tuple(later)
    explicit_hash = own.get("__hash__") is not None
    cls._values_fields = fields
    cls.__dataclass_fields__ = _FieldsOnDemand(cls)
    # as dataclasses: a method the class writes itself stays
    if "__match_args__" not in own:
        cls.__match_args__ = tuple(names)
    if "__init__" not in own:
        cls.__init__ = _init(cls, init, later)
    if with_repr and "__repr__" not in own:
        cls.__repr__ = _repr(tuple(shown))
    if eq:
        if "__eq__" not in own:
            cls.__eq__ = _eq(tuple(compared))
        if frozen and not explicit_hash:
            cls.__hash__ = _hash(tuple(hashed))
        elif not explicit_hash:
            cls.__hash__ = None  # as dataclasses: mutable and compared by value, so not hashable
    if frozen:
        if "__setattr__" in own or "__delattr__" in own:
            raise TypeError(f"cannot overwrite __setattr__/__delattr__ in frozen class {cls.__qualname__}")
        field_names = set(fields)
        cls.__setattr__ = _frozen_setattr(cls, field_names)
        cls.__delattr__ = _frozen_delattr(cls, field_names)
    return cls


_NOT_HERE = ("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")


def _init(cls: type, init: tuple, later: tuple):
    qual = cls.__qualname__
    assign = object.__setattr__
    has_post = hasattr(cls, "__post_init__")

    # every field at its plain default (no factory): what a call without arguments gives
    defaults = None if later or has_post or any(d is MISSING for _, d, _ in init) else \
        tuple((name, d) for name, d, _ in init)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and type(self) is cls:
            if len(args) == len(init) and not later and not has_post:
                # the common call, all positional (a subclass may add __post_init__: the long way)
                for (name, _, _), value in zip(init, args):
                    assign(self, name, value)
                return
            if not args and defaults is not None:  # all defaults (a config section's, say)
                for name, value in defaults:
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
            from dataclasses import FrozenInstanceError

            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr(cls: type, names: set[str]):
    def __delattr__(self, name: str) -> None:
        if type(self) is cls or name in names:
            from dataclasses import FrozenInstanceError

            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__



# --- dataclasses' functions, for classes made here without importing dataclasses (anything else: theirs)


def _own_fields(obj: Any) -> dict[str, Field] | None:
    return getattr(obj if isinstance(obj, type) else type(obj), "_values_fields", None)


def fields(class_or_instance: Any) -> tuple[Field, ...]:
    """As :func:`dataclasses.fields`; for a class made here its :class:`Field` records (``default`` is
    this module's :data:`MISSING` when there is none)."""
    own = _own_fields(class_or_instance)
    if own is None:
        import dataclasses

        return dataclasses.fields(class_or_instance)
    return tuple(own.values())


def is_dataclass(obj: Any) -> bool:
    if _own_fields(obj) is not None:
        return True
    dc = sys.modules.get("dataclasses")  # not loaded: no class was made by it
    return dc is not None and dc.is_dataclass(obj)


def replace(obj: Any, /, **changes: Any) -> Any:
    """As :func:`dataclasses.replace`."""
    own = None if isinstance(obj, type) else _own_fields(obj)
    if own is None or any(not f.init and n in changes for n, f in own.items()):
        import dataclasses  # theirs, or the error they raise (its type differs between Pythons)

        return dataclasses.replace(obj, **changes)
    for name, f in own.items():
        if f.init and name not in changes:
            changes[name] = getattr(obj, name)
    return obj.__class__(**changes)


_ATOMS = (str, int, float, bool, bytes, type(None))


def asdict(obj: Any, *, dict_factory: Any = dict) -> dict[str, Any]:
    """As :func:`dataclasses.asdict`: fields in order, recursing into values, lists, tuples and dicts,
    other values deep-copied."""
    if isinstance(obj, type) or not is_dataclass(obj):
        raise TypeError("asdict() should be called on dataclass instances")
    return _asdict(obj, dict_factory)


def _asdict(obj: Any, dict_factory: Any) -> Any:
    if isinstance(obj, _ATOMS):
        return obj
    own = None if isinstance(obj, type) else _own_fields(obj)
    if own is not None:
        return dict_factory([(name, _asdict(getattr(obj, name), dict_factory)) for name in own])
    dc = sys.modules.get("dataclasses")
    if dc is not None and not isinstance(obj, type) and dc.is_dataclass(obj):
        return dc.asdict(obj, dict_factory=dict_factory)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*[_asdict(v, dict_factory) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_asdict(v, dict_factory) for v in obj)
    if isinstance(obj, dict):
        if hasattr(type(obj), "default_factory"):  # a defaultdict
            out = type(obj)(obj.default_factory)
            for k, v in obj.items():
                out[_asdict(k, dict_factory)] = _asdict(v, dict_factory)
            return out
        return type(obj)((_asdict(k, dict_factory), _asdict(v, dict_factory)) for k, v in obj.items())
    import copy

    return copy.deepcopy(obj)


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


# --- a config key on its section's field ---------------------------------------------------



@dataclass(frozen=True)
class Range:
    """The values a number can take and still work; ``open`` ends exclude the bound itself."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def admits(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "must be " + " and ".join(parts) + (f" ({self.why})" if self.why else "")


POSITIVE = Range(0, low_open=True)


def setting(default: Any, *, range: Range | None = None, choices: tuple[str, ...] | None = None, doc: str = "",
            example: Any = MISSING) -> Any:
    """A section's field for one key: its ``default``, the ``range`` or ``choices`` it must be in, and
    ``doc``, what it does. ``example``: the example config shows the key commented out with this value
    (a key whose default is "unset", or a table)."""
    meta: dict[str, Any] = {"doc": doc}
    if range is not None:
        meta["range"] = range
    if choices is not None:
        meta["choices"] = choices
    if example is not MISSING:
        meta["example"] = example
    if isinstance(default, dict):  # a table: each instance its own (only {} is a default here)
        return Field(MISSING, dict, metadata=meta)
    return Field(default, metadata=meta)  # as values.field(default=..., metadata=...), one call less

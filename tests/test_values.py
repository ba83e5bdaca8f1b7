"""slurm_hooks.values.dataclass behaves as dataclasses.dataclass for what this code uses, and is
cheaper to define."""

from __future__ import annotations

import builtins
import copy
import dataclasses

import pytest

from slurm_hooks import models
from slurm_hooks.values import dataclass, field


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    seen: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Point3(Point):
    z: int = 5


@dataclass
class Counter:
    n: int = 0
    items: list = field(default_factory=list)
    total: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.total = self.n + len(self.items)


@dataclass
class Explicit:
    a: int

    def __repr__(self) -> str:
        return "mine"


def test_init_defaults_factories_and_errors_as_dataclasses():
    p = Point(1, tags=("a",))
    assert (p.x, p.y, p.tags, p.seen) == (1, 0, ("a",), {})
    assert Point(1).seen is not Point(1).seen
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()
    with pytest.raises(TypeError, match="unexpected keyword argument 'w'"):
        Point(1, w=2)
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)
    with pytest.raises(TypeError, match="positional arguments"):
        Point(1, 2, (), {}, 5)


def test_frozen_eq_hash_repr():
    assert Point(1, 2) == Point(1, 2, seen={"a": 1})  # compare=False
    assert Point(1, 2) != Point(1, 3) and Point(1) != Point3(1)
    assert hash(Point(1, 2)) == hash(Point(1, 2, seen={"x": 1}))
    assert repr(Point(1, 2)) == "Point(x=1, y=2, tags=())"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Point(1).x = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        del Point(1).x


def test_mutable_post_init_init_false_not_hashable_and_explicit_methods_kept():
    c = Counter(2, [1])
    assert c.total == 3
    c.n = 5
    assert c.n == 5 and c != Counter(5, [1])  # total was set by __post_init__: 3, not 6
    with pytest.raises(TypeError):
        hash(c)
    assert repr(Explicit(1)) == "mine"


def test_dataclasses_functions_work_on_them():
    p = Point3(1, 2, z=9)
    assert [f.name for f in dataclasses.fields(p)] == ["x", "y", "tags", "seen", "z"]
    assert dataclasses.replace(p, y=7) == Point3(1, 7, z=9)
    assert dataclasses.asdict(p) == {"x": 1, "y": 2, "tags": (), "seen": {}, "z": 9}
    assert dataclasses.is_dataclass(p) and dataclasses.is_dataclass(Point3)
    assert copy.deepcopy(p) == p
    @dataclasses.dataclass
    class Std:
        total: int = dataclasses.field(default=0, init=False)

    with pytest.raises(Exception) as std:
        dataclasses.replace(Std(), total=3)
    # init=False refused as dataclasses itself refuses it (ValueError before Python 3.13, TypeError since)
    with pytest.raises(std.type, match="init=False"):
        dataclasses.replace(Counter(1), total=3)


def test_non_default_after_default_is_refused():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @dataclass
        class Bad:
            a: int = 1
            b: int


def test_the_models_round_trip_as_before():
    snap = models.NodeSnapshot(node="n1", backend="sim", gpus=(models.GpuSnapshot(index=0, uuid="GPU-0"),))
    assert models.snapshot_from_dict(models.snapshot_to_dict(snap)) == snap


def _source_compiled_while(define, monkeypatch) -> int:
    """How many times ``exec``/``compile`` ran while ``define()`` did (patched for that span only)."""
    compiled = []

    def counting(builtin):
        def call(*args, **kwargs):
            compiled.append(builtin.__name__)
            return builtin(*args, **kwargs)
        return call

    with monkeypatch.context() as patched:
        patched.setattr(builtins, "exec", counting(builtins.exec))
        patched.setattr(builtins, "compile", counting(builtins.compile))
        define()
    return len(compiled)


def test_defining_a_class_compiles_no_source_where_dataclasses_does(monkeypatch):
    """What makes dataclasses cost ~1 ms a class is compiling its methods from source text; ours
    must compile nothing (the cost itself is measured in bench/, not asserted in a timed test)."""
    def define_with(decorator):
        def define():
            @decorator(frozen=True)
            class C:
                a: int
                b: str = ""
                e: int | None = None

            @decorator
            class D:
                n: int = 0
                items: list = field(default_factory=list)
            return C, D
        return define

    assert _source_compiled_while(define_with(dataclasses.dataclass), monkeypatch) > 0  # the count sees it
    assert _source_compiled_while(define_with(dataclass), monkeypatch) == 0


def test_the_healthy_check_and_prolog_define_no_class_with_dataclasses_exec(tmp_path):
    """A module on the hot path that goes back to dataclasses.dataclass pays ~1 ms a class at every
    check and prolog: caught here (and click must stay off that path too)."""
    import subprocess
    import sys

    from fakes.config import write_sim_config

    conf = write_sim_config(tmp_path)
    code = f"""
import sys
from slurm_hooks.probes import sim
from slurm_hooks import config
cfg = config.load({str(conf)!r})
sim.init(cfg.gpu.sim_dir, "n1", 8)
from slurm_hooks.entry import _run_hook
import os
os.environ.update(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,1")
assert _run_hook("check", {str(conf)!r}, "n1") == 0
assert _run_hook("prolog", {str(conf)!r}, "n1") == 0
slow = sorted(f"{{m}}.{{n}}" for m, mod in list(sys.modules.items()) if m.startswith("slurm_hooks")
              for n, c in vars(mod).items() if isinstance(c, type) and c.__module__ == m
              and "__dataclass_params__" in vars(c))
print(slow, "click" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"

"""The shape of the healthy check's and prolog's start-up (what bench/bench_check.py times): with the
parsed config kept from an earlier run, no TOML parser, subprocess, dataclasses (inspect), typing or
click, and no pattern of ours compiled at import; and the kept config never hides an edit from the next run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Modules a warm healthy check or prolog must not load (each costs ms at every start).
NOT_ON_THE_PATH = ("tomllib", "tomli", "subprocess", "dataclasses", "inspect", "typing", "copy", "click", "jinja2",
                   "kubernetes", "queue", "shlex", "fnmatch", "hashlib",
                   # only a job being requeued (its checkpoint signal), only an XID to look up
                   "slurm_hooks.remedy.checkpoint", "slurm_hooks.slurm.jobsignal", "slurm_hooks.xid.catalog")

_PROBE = """
import sys
before = set(sys.modules)  # what the interpreter (and an editable install's import hook) loaded itself
import contextlib, io, json, re
from slurm_hooks import entry
from slurm_hooks.values import compile_later
rcs = []
for hook in ("check", "prolog"):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            entry.main([hook, "--config", sys.argv[1]])
    except SystemExit as exc:
        rcs.append(exc.code)
ours = [(n, m) for n, m in list(sys.modules.items()) if n.startswith("slurm_hooks")]
at_import = sorted(f"{n}.{k}" for n, m in ours for k, v in vars(m).items() if isinstance(v, re.Pattern))
print(json.dumps({"rcs": rcs, "modules": sorted(set(sys.modules) - before), "compiled_at_import": at_import}))
"""


@pytest.fixture
def node(tmp_path):
    """A config and 8 simulated GPUs, as bench/bench_check.py sets them up."""
    conf = tmp_path / "config.toml"
    conf.write_text(f'[gpu]\nbackend = "sim"\nsim_dir = "{tmp_path}/sim"\n[log]\naudit = "{tmp_path}/audit.jsonl"\n'
                    f'[state]\ndir = "{tmp_path}/state"\n[check]\ndrain = false\n[repair]\nenabled = false\n'
                    f'[slurm]\nbin_dir = "{tmp_path}/no-slurm"\n[expect]\ngpus = 8\n')
    env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}
    env.pop("SLURM_HOOKS_CONFIG", None)
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "sim", "init", "--node", "n1", "--gpus", "8",
                          "--config", str(conf)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return str(conf), env


def _check(conf: str, env: dict) -> subprocess.CompletedProcess:
    """The healthy check as the installed program runs it."""
    return subprocess.run([sys.executable, "-I", "-m", "slurm_hooks", "check", "--config", conf], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_warm_check_and_prolog_load_no_parser_subprocess_or_click_and_compile_no_pattern_at_import(node):
    conf, env = node
    first = _check(conf, env)  # a cold run: parses the file and keeps the table
    assert first.returncode == 0, first.stdout + first.stderr
    # not -I: the checkout under test (PYTHONPATH), which an install elsewhere would hide
    out = subprocess.run([sys.executable, "-c", _PROBE, conf], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["rcs"] == [0, 0]
    loaded = sorted(set(NOT_ON_THE_PATH) & set(seen["modules"]))
    assert loaded == [], f"a module on the healthy path imports {loaded} at import: import it where it is used"
    assert not any(m.startswith(("click.", "kubernetes.", "jinja2.")) for m in seen["modules"])
    assert seen["compiled_at_import"] == [], "use slurm_hooks.values.compile_later for these"


def test_an_edit_of_the_same_size_and_mtime_is_seen_by_the_next_check(node):
    conf, env = node
    assert _check(conf, env).returncode == 0
    st = os.stat(conf)
    with open(conf, encoding="utf-8") as fh:
        text = fh.read()
    with open(conf, "w", encoding="utf-8") as fh:
        fh.write(text.replace("gpus = 8", "gpus = 9"))
    os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(conf).st_size == st.st_size
    edited = _check(conf, env)
    assert edited.returncode == 1, edited.stdout + edited.stderr
    assert "9 expected" in edited.stdout


# --- values' own replace/asdict/fields/is_dataclass: as dataclasses' (so the hot path can drop it) -------


def _samples():
    import collections
    import dataclasses

    from slurm_hooks import models
    from slurm_hooks.values import dataclass, field

    Pair = collections.namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Theirs:
        n: int = 1
        items: list = dataclasses.field(default_factory=list)

    @dataclass(frozen=True)
    class Base:
        x: int
        tags: tuple = ()

    @dataclass
    class Ours(Base):
        nested: dict = field(default_factory=dict)
        total: int = field(default=0, init=False)
        theirs: Theirs = field(default_factory=Theirs)
        pairs: list = field(default_factory=list)

    snap = models.NodeSnapshot(node="n1", backend="sim", gpus=(models.GpuSnapshot(index=0, uuid="GPU-0"),))
    ours = Ours(1, ("a",), nested={"k": [Base(2)], 3: (Base(3, ("b",)),)}, theirs=Theirs(2, [Base(4)]),
                pairs=[Pair(Base(5), {"z": 1})])
    return snap, ours, Base


def test_values_replace_asdict_fields_and_is_dataclass_give_what_dataclasses_gives():
    import dataclasses

    from slurm_hooks import values

    snap, ours, base = _samples()
    for obj in (snap, ours, ours.theirs):
        assert values.asdict(obj) == dataclasses.asdict(obj)
        assert values.asdict(obj, dict_factory=list) == dataclasses.asdict(obj, dict_factory=list)
        assert [f.name for f in values.fields(obj)] == [f.name for f in dataclasses.fields(obj)]
        assert values.is_dataclass(obj) and values.is_dataclass(type(obj))
    assert values.replace(snap, node="n2") == dataclasses.replace(snap, node="n2")
    assert values.replace(ours, x=7).x == 7 and values.replace(ours, x=7).nested is ours.nested
    assert values.replace(base(1), tags=("t",)) == base(1, ("t",))
    assert not values.is_dataclass(3) and not values.is_dataclass(dict)
    for call in (lambda m: m.replace(ours, total=3), lambda m: m.replace(ours, nope=1), lambda m: m.asdict(base),
                 lambda m: m.asdict({"a": 1})):
        with pytest.raises(Exception) as theirs:
            call(dataclasses)
        with pytest.raises(theirs.type):
            call(values)


def test_classes_made_and_used_through_values_import_neither_dataclasses_nor_typing():
    code = """
import sys
before = set(sys.modules)  # (an editable install's import hook may load typing itself)
from slurm_hooks import values

@values.dataclass(frozen=True)
class P:
    x: int
    tags: tuple = ()
    seen: dict = values.field(default_factory=dict, compare=False)

p = values.replace(P(1), tags=("a",))
assert values.asdict(p) == {"x": 1, "tags": ("a",), "seen": {}} and [f.name for f in values.fields(P)] == ["x", "tags", "seen"]
assert values.is_dataclass(p) and p == P(1, ("a",)) and hash(p) == hash(P(1, ("a",)))
print(*(m in set(sys.modules) - before for m in ("dataclasses", "typing", "inspect")))
import dataclasses
assert [f.name for f in dataclasses.fields(p)] == ["x", "tags", "seen"] and dataclasses.replace(p, x=2).x == 2
try:
    p.x = 3
except dataclasses.FrozenInstanceError:
    print("frozen")
"""
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False", "frozen"]


def test_the_nvml_probe_adds_no_typing_dataclasses_or_inspect_to_what_pynvml_loads():
    """A node with GPUs imports the NVML probe on every run, on top of pynvml (bench_check's row)."""
    pytest.importorskip("pynvml")
    code = ("import json, sys, pynvml\nbefore = set(sys.modules)\nimport slurm_hooks.probes.nvml\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    # not -I: the checkout under test (PYTHONPATH)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    added = json.loads(out.stdout)
    assert [m for m in NOT_ON_THE_PATH if m in added] == []

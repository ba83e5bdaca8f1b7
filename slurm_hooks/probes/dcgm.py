"""DCGM diagnostics through ``dcgmi diag -r LEVEL -j``.

Three answers, never more: passed (``passed=True``: every result of every test is Pass), a GPU
fault (``passed=False``: a result is Fail, named by its GPU where DCGM names one), or not
verified (``passed=None``). A missing dcgmi is a reason, not a failure (``available=False``).
Not verified is the tool's trouble, never the GPUs': a host engine that cannot be reached, our
budget running out, output without JSON, a ``runtime_error`` ("another diagnostic is running",
a version mismatch), no results at all; and a run whose tests were skipped or warned (nvvs
starts every entity at SKIP and plugins skip disabled tests: a Skip is not a Pass). Both JSON
shapes are read: DCGM 3.x ("DCGM GPU Diagnostic", results per ``gpu_ids``) and 4.x ("DCGM
Diagnostic", results per ``entity_group``/``entity_id``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from slurm_hooks.errors import CommandError, CommandTimeout
from slurm_hooks.models import DcgmResult
from slurm_hooks.runner import Runner, run_command

DEFAULT_DCGMI = "/usr/bin/dcgmi"

_ROOT_KEYS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")
_PASS = "pass"
_FAIL = {"fail", "failed", "error"}
#: Results not passed that one reason names (the rest are counted).
_NAMED = 3
#: dcgmi's words when nv-hostengine is not there to ask.
_NO_HOSTENGINE = ("unable to establish a connection", "connection to the host engine", "host engine is not running")
_MAX_TEXT = 300


def run_diag(level: int, timeout: float, dcgmi: str = DEFAULT_DCGMI, runner: Runner = run_command) -> DcgmResult:
    """Run one diagnostic; never raises for anything dcgmi does."""
    if not (os.path.isfile(dcgmi) and os.access(dcgmi, os.X_OK)):
        return DcgmResult(level, available=False, reason=f"dcgmi not installed at {dcgmi}")
    argv = [dcgmi, "diag", "-r", str(level), "-j"]
    try:
        done = runner(argv, timeout, check=False)
    except CommandTimeout:
        # Our own budget ran out, not the GPUs: say so, do not drain for it.
        return DcgmResult(level, True, None, reason=f"dcgmi diag -r {level} did not finish within our {timeout:g}s "
                                                   "budget ([dcgm] timeout, [check] deadline)")
    except CommandError as exc:
        if exc.returncode is None:
            return DcgmResult(level, available=False, reason=f"dcgmi not runnable at {dcgmi}: {_line(exc.stderr)}")
        return DcgmResult(level, True, None, reason=f"dcgmi diag -r {level} could not run: {exc}")
    return parse(level, done.stdout, done.stderr, done.returncode)


#: What reasons call it (``DcgmResult.tool``).
NAME = "DCGM diag"


def make_runner(dcgmi: str = DEFAULT_DCGMI, runner: Runner = run_command,
                max_timeout: float | None = None) -> Callable[[int, float], DcgmResult]:
    """A ``(level, timeout) -> DcgmResult`` for the engine (``engine.DcgmRunner``).

    ``max_timeout`` (the config's ``[dcgm] timeout``) caps the time the engine offers.
    """

    def run(level: int, timeout: float) -> DcgmResult:
        if max_timeout is not None:
            timeout = min(timeout, max_timeout)
        return run_diag(level, timeout, dcgmi=dcgmi, runner=runner)

    return run


def parse(level: int, stdout: str, stderr: str = "", returncode: int = 0) -> DcgmResult:
    """Turn dcgmi's output into a result; ``returncode`` only explains output without JSON."""
    doc = _document(stdout)
    if doc is None:
        text = _line(stderr) or _line(stdout) or "no output"
        if any(words in f"{stdout}\n{stderr}".lower() for words in _NO_HOSTENGINE):
            return DcgmResult(level, True, None, reason=f"nv-hostengine not reachable: {text}")
        return DcgmResult(level, True, None, reason=f"dcgmi diag -r {level} (exit {returncode}) gave no JSON: {text}")
    root = next((doc[k] for k in _ROOT_KEYS if isinstance(doc.get(k), dict)), doc)
    runtime_error = root.get("runtime_error") or doc.get("runtime_error")
    if runtime_error:
        return DcgmResult(level, True, None, reason=f"DCGM runtime error: {_line(str(runtime_error))}")
    results = list(_results(root))
    if not results:
        return DcgmResult(level, True, None, reason=f"dcgmi diag -r {level} reported no test results")
    failures = tuple((gpus[0] if len(gpus) == 1 else None, _what(test, gpus, why, len(gpus) != 1))
                     for test, status, gpus, why in results if status in _FAIL)
    if failures:
        return DcgmResult(level, True, False, failures, reason=f"{len(failures)} failing result(s)")
    short = [(test, status, gpus, why) for test, status, gpus, why in results if status != _PASS]
    if short:
        named = "; ".join(f"{status or 'no status'}: {_what(test, gpus, why, True)}"
                          for test, status, gpus, why in short[:_NAMED])
        more = f" (+{len(short) - _NAMED} more)" if len(short) > _NAMED else ""
        return DcgmResult(level, True, None, reason=f"{len(short)} of {len(results)} result(s) did not pass: "
                                                   f"{named}{more}")
    return DcgmResult(level, True, True, reason=f"{len(results)} results, all passed")


def _what(test: str, gpus: tuple[int, ...], why: str, name_gpus: bool) -> str:
    """``memory: <DCGM's first warning>``; with ``name_gpus``, ``Denylist on GPUs 0,1: ...``."""
    where = ""
    if name_gpus and gpus:
        where = f" on GPU {gpus[0]}" if len(gpus) == 1 else f" on GPUs {','.join(map(str, gpus))}"
    return f"{test}{where}: {why}" if why else f"{test}{where}"


def _document(stdout: str) -> dict[str, Any] | None:
    """The JSON object in dcgmi's output; it may print a banner line before it."""
    start, end = stdout.find("{"), stdout.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        doc = json.loads(stdout[start:end + 1])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _results(root: dict[str, Any]):
    """Yield (test name, status lowercased, the GPU indexes it covers, first warning) per result."""
    tests: list[Any] = []
    for category in root.get("test_categories") or ():
        if isinstance(category, dict):
            tests.extend(category.get("tests") or ())
    tests.extend(root.get("tests") or ())
    for test in tests:
        if not isinstance(test, dict):
            continue  # DCGM 3.1 puts nulls between tests
        name = str(test.get("name") or "unnamed test")
        for result in test.get("results") or ():
            if isinstance(result, dict):
                status = result.get("status")
                yield name, status.strip().lower() if isinstance(status, str) else "", _gpus(result), _warning(result)


def _gpus(result: dict[str, Any]) -> tuple[int, ...]:
    """The GPU indexes one result covers (``gpu_ids: "0,1"``, ``entity_id``); () for none or another
    entity (an NVSwitch, a CPU)."""
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU")).upper()
        ids: Any = result["entity_id"] if group == "GPU" else None
    else:
        ids = result.get("gpu_id", result.get("gpu_ids"))
    if isinstance(ids, bool):
        return ()
    if isinstance(ids, int):
        return (ids,)
    if isinstance(ids, str):
        parts = [p.strip() for p in ids.split(",") if p.strip()]
        if parts and all(p.isdigit() for p in parts):
            return tuple(int(p) for p in parts)
    return ()


def _warning(result: dict[str, Any]) -> str:
    for item in result.get("warnings") or ():
        text = item.get("warning", "") if isinstance(item, dict) else item
        if isinstance(text, str) and text.strip():
            return _squeeze(text)
    return ""


def _line(text: str) -> str:
    """The last non-empty line: where a program says what went wrong."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return _squeeze(lines[-1]) if lines else ""


def _squeeze(text: str) -> str:
    """One line, bounded: fit for a finding or a drain reason."""
    line = " ".join(text.split())
    return line if len(line) <= _MAX_TEXT else line[:_MAX_TEXT - 3] + "..."

"""DCGM diagnostics through ``dcgmi diag -r LEVEL -j``.

A missing dcgmi is a reason, not a failure (``available=False``). A host
engine that cannot be reached means the diagnostic did not run
(``passed=None``): that is the node's DCGM service, not its GPUs. A run that
timed out or printed something unreadable failed as a whole (``passed=False``
and no per-GPU failures). Both JSON shapes are read: DCGM 3.x ("DCGM GPU
Diagnostic", results per ``gpu_ids``) and 4.x ("DCGM Diagnostic", results per
``entity_group``/``entity_id``).
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
_FAIL = {"fail", "failed", "error"}
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
        return DcgmResult(level, True, False, reason=f"dcgmi diag -r {level} failed: {exc}")
    return parse(level, done.stdout, done.stderr, done.returncode)


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
        return DcgmResult(level, True, False, reason=f"dcgmi diag -r {level} (exit {returncode}) gave no JSON: {text}")
    root = next((doc[k] for k in _ROOT_KEYS if isinstance(doc.get(k), dict)), doc)
    runtime_error = root.get("runtime_error") or doc.get("runtime_error")
    if runtime_error:
        return DcgmResult(level, True, False, reason=f"DCGM runtime error: {_line(str(runtime_error))}")
    results = list(_results(root))
    if not results:
        return DcgmResult(level, True, False, reason=f"dcgmi diag -r {level} reported no test results")
    failures = tuple((gpu, f"{test}: {why}" if why else test)
                     for test, status, gpu, why in results if status in _FAIL)
    if failures:
        return DcgmResult(level, True, False, failures, reason=f"{len(failures)} failing result(s)")
    return DcgmResult(level, True, True, reason=f"{len(results)} results, none failed")


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
    """Yield (test name, status lowercased, GPU index or None, first warning) per result."""
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
            if isinstance(result, dict) and isinstance(result.get("status"), str):
                yield name, result["status"].strip().lower(), _gpu(result), _warning(result)


def _gpu(result: dict[str, Any]) -> int | None:
    """One GPU index, or None for results that cover several GPUs or none."""
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU")).upper()
        ids: Any = result["entity_id"] if group == "GPU" else None
    else:
        ids = result.get("gpu_id", result.get("gpu_ids"))
    if isinstance(ids, bool):
        return None
    if isinstance(ids, int):
        return ids
    if isinstance(ids, str) and ids.strip().isdigit():
        return int(ids.strip())
    return None


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

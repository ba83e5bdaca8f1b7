"""DCGM diagnostic results, as run by the engine for the context's level.

No DCGM on the node is a reason, not a failure. A diagnostic that could not run
(host engine down, our budget, no JSON, a runtime error) or did not pass every
test (Skip, Warn) vouches for nothing: a warning, which ``repair --validate``
and the sweep report as unverified; never a GPU fault, never a drain. A failing
GPU asks for a reset, named; a failure DCGM ties to no one GPU drains the node.
"""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity


def check_diag(inp: CheckInput) -> Iterator[Finding]:
    result = inp.dcgm
    if result is None:
        return
    level = f"L{result.level}"
    if not result.available:
        yield Finding("dcgm", Severity.OK, Action.NONE, "DCGM not installed: diagnostics skipped"
                      + (f" ({result.reason})" if result.reason else ""))
        return
    if result.passed:
        return
    if not result.failures:  # passed None, or a producer's False with nothing named: the tool's, not a GPU's
        yield Finding("dcgm", Severity.WARN, Action.WARN, f"DCGM diag {level} not verified: {result.reason}",
                      summary=f"DCGM diag {level} not verified")
        return
    wanted = None if inp.gpus is None else set(inp.gpus)
    by_gpu: dict[int | None, list[str]] = {}
    for gpu, why in result.failures:
        if gpu is None or wanted is None or gpu in wanted:
            by_gpu.setdefault(gpu, []).append(why)
    for gpu, whys in sorted(by_gpu.items(), key=lambda item: -1 if item[0] is None else item[0]):
        if gpu is None:
            yield Finding("dcgm", Severity.FAIL, Action.DRAIN, f"DCGM diag {level} failed: {'; '.join(whys)}",
                          summary=f"DCGM diag {level} failed")
        else:
            yield Finding("dcgm", Severity.FAIL, Action.RESET, f"DCGM diag {level} failed: {'; '.join(whys)}", gpu,
                          f"DCGM diag {level} failed on GPU {gpu}")

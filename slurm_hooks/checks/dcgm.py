"""The GPU diagnostic's results (DCGM's ``dcgmi diag``, RVS on AMD nodes), as run by the engine for
the context's level, each said in its own tool's name (``DcgmResult.tool``).

No diagnostic on the node is a reason, not a failure. A diagnostic that could not run
(host engine down, our budget, no JSON, a runtime error) or did not pass every
test (Skip, Warn) vouches for nothing: a warning, which ``repair --validate``
and the sweep report as unverified; never a GPU fault, never a drain. A failing
GPU asks for a reset, named; a failure the tool ties to no one GPU drains the node.
"""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity
from slurm_hooks.values import compile_later

#: What every diagnostic finding's summary holds, whichever tool ran (``DCGM diag L2``, ``RVS diagnostic
#: L3``): how a drain reason tells it was the diagnostic's (a periodic check, which runs none, never
#: resumes such a node).
_SAID = compile_later(r"\bdiag(?:nostic)? L\d+ ")


def said_by_diagnostic(reason: str) -> bool:
    """Whether a drain reason is a diagnostic's finding, whichever vendor's tool ran it."""
    return _SAID.search(reason) is not None


def check_diag(inp: CheckInput) -> Iterator[Finding]:
    result = inp.dcgm
    if result is None:
        return
    diag = f"{result.tool} L{result.level}"
    if not result.available:
        product = result.tool.split(" ", 1)[0]  # "DCGM", "RVS"
        yield Finding("dcgm", Severity.OK, Action.NONE, f"{product} not installed: diagnostics skipped"
                      + (f" ({result.reason})" if result.reason else ""))
        return
    if result.passed:
        return
    if not result.failures:  # passed None, or a producer's False with nothing named: the tool's, not a GPU's
        yield Finding("dcgm", Severity.WARN, Action.WARN, f"{diag} not verified: {result.reason}",
                      summary=f"{diag} not verified")
        return
    wanted = None if inp.gpus is None else set(inp.gpus)
    by_gpu: dict[int | None, list[str]] = {}
    for gpu, why in result.failures:
        if gpu is None or wanted is None or gpu in wanted:
            by_gpu.setdefault(gpu, []).append(why)
    for gpu, whys in sorted(by_gpu.items(), key=lambda item: -1 if item[0] is None else item[0]):
        if gpu is None:
            yield Finding("dcgm", Severity.FAIL, Action.DRAIN, f"{diag} failed: {'; '.join(whys)}",
                          summary=f"{diag} failed")
        else:
            yield Finding("dcgm", Severity.FAIL, Action.RESET, f"{diag} failed: {'; '.join(whys)}", gpu,
                          f"{diag} failed on GPU {gpu}")

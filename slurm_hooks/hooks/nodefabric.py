"""Per-node fabric tests for the sweep: the node's own NICs, without a second node.

- ``nccl-nics``: nccl-tests' ``all_reduce_perf`` on every GPU of the node with NVLink and shared
  memory off (``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``), so that its traffic loops through the
  NICs; its ``# Avg bus bandwidth`` (GB/s) against ``[sweep] nccl_nics_busbw_gbps``.
- ``ib_write_bw <hca>``: perftest's GPU-direct loopback on each HCA: a server and a client of
  ``ib_write_bw -d <hca> --use_cuda=<gpu> --report_gbits`` on this node; the client's
  ``BW average[Gb/sec]`` against ``[sweep] ib_write_bw_gbps`` (for scale: Azure's H100 check
  wants 380 Gb/s per HCA with GPU-direct, and 460 GB/s from its single-node NCCL all-reduce).

Run by the sweep, and by a repair's validation where ``[repair] fabric_tests`` (:func:`validate`:
a figure under its floor fails the validation, a test with a floor that could not run leaves the
node unverified).

Gather (:func:`run_tests`: the tools, each bounded), then judge (:func:`judge`: a figure against
its floor). A tool not installed, a test that exits non-zero or times out, or output that is not
the tool's own format (cut short, garbled, another unit) is ``not-run``: never a pass, never a
fail. A figure with no floor set is ``measured``: recorded for ``validate --learn`` to propose one.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from slurm_hooks.values import dataclass, replace

if TYPE_CHECKING:
    from slurm_hooks.models import Report
    from slurm_hooks.remedy.wiring import Wiring

NCCL_NICS = "nccl-nics"
IB_WRITE_BW = "ib_write_bw"
#: What the NCCL test's ranks get: NVLink and shared memory off, so that the traffic crosses the NICs.
NICS_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
#: ib_write_bw's TCP port for the first HCA's loopback (one more per HCA).
IB_PORT = 18515
IB_SECONDS = 5
RESULTS = ("passed", "failed", "measured", "not-run")

_NCCL_HEADER = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw\s+#wrong", re.M)
_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.M)
_NCCL_ROW = re.compile(r"^\s+\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s+(.*)$", re.M)
_IB_TITLE = re.compile(r"^\s*RDMA_Write BW Test\s*$", re.M)
_IB_HEADER = re.compile(r"^\s*#bytes\s+#iterations\s+BW peak\[(\w+/sec)\]\s+BW average\[(\w+/sec)\]\s+MsgRate\[Mpps\]"
                        r"\s*$", re.M)
_IB_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


@dataclass(frozen=True)
class FabricTest:
    """One test's result: ``result`` one of :data:`RESULTS`; ``figure`` in ``unit``; ``detail`` says why."""

    name: str
    result: str
    detail: str
    figure: float | None = None
    unit: str = ""
    floor: float = 0.0


def parse_all_reduce(text: str) -> tuple[float | None, str]:
    """(busbw GB/s, "") from all_reduce_perf's output, or (None, why it is not one): its table
    header, at least one row with no wrong element, and its ``# Avg bus bandwidth`` line."""
    if not _NCCL_HEADER.search(text):
        return None, "no all_reduce_perf result table in its output"
    rows = [r.split() for r in _NCCL_ROW.findall(text)]
    if not rows:
        return None, "its result table has no row"
    # time algbw busbw #wrong, out of place and (as a rule) in place: a row of another width is cut short
    if any(len(r) not in (4, 8) or not all(_number(x) for x in r) for r in rows):
        return None, "a row of its result table is cut short or garbled"
    wrong = [r[-1] for r in rows if r[-1] not in ("0", "N/A")]
    if wrong:
        return None, f"{len(wrong)} size(s) reported wrong elements (#wrong {', '.join(wrong[:3])})"
    avg = _NCCL_AVG.findall(text)
    if len(avg) != 1:
        return None, "no '# Avg bus bandwidth' line in its output" if not avg else "more than one run in its output"
    return float(avg[0]), ""


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text == "N/A"
    return True


def parse_ib_write_bw(text: str) -> tuple[float | None, str]:
    """(BW average Gb/s, "") from an ``ib_write_bw --report_gbits`` client's output, or (None, why):
    its title, its table header in Gb/sec, and one complete row under it."""
    if not _IB_TITLE.search(text):
        return None, "no 'RDMA_Write BW Test' in its output"
    head = _IB_HEADER.search(text)
    if not head:
        return None, "no result table in its output"
    if head.group(2) != "Gb/sec":
        return None, f"its figures are in {head.group(2)}, not Gb/sec (--report_gbits)"
    lines = [x for x in text[head.end():].splitlines() if x.strip()]
    row = _IB_ROW.match(lines[0]) if lines else None
    if not row:
        return None, "its result table has no complete row"
    return float(row.group(4)), ""


def judge(name: str, figure: float | None, why: str, floor: float, unit: str) -> FabricTest:
    """A parsed figure against its floor (0: none set, the figure is only measured)."""
    if figure is None:
        return FabricTest(name, "not-run", f"could not run: {why}", floor=floor)
    if floor <= 0:
        return FabricTest(name, "measured", f"{figure:g} {unit}; no floor set", figure, unit)
    if figure < floor:
        return FabricTest(name, "failed", f"{figure:g} {unit} < floor {floor:g}", figure, unit, floor)
    return FabricTest(name, "passed", f"{figure:g} {unit} >= floor {floor:g}", figure, unit, floor)


Run = Callable[..., "tuple[int | None, str]"]


def run_tool(argv: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """(exit code, stdout and stderr) of one bounded run; (None, why) when it did not run or finish."""
    from slurm_hooks.errors import CommandError, CommandTimeout
    from slurm_hooks.runner import run_command

    try:
        done = run_command(list(argv), timeout, check=False, env={**os.environ, **(env or {})})
    except CommandTimeout:
        return None, f"did not finish within {timeout:g}s"
    except CommandError as exc:
        return None, str(exc)
    return done.returncode, (done.stdout or "") + (done.stderr or "")


def nccl_nics(perf: str, gpus: int, floor: float, timeout: float, run: Run = run_tool) -> FabricTest:
    if not os.access(perf, os.X_OK):
        return FabricTest(NCCL_NICS, "not-run", f"{perf} is not installed", floor=floor)
    code, text = run([perf, "-b", "8M", "-e", "256M", "-f", "2", "-g", str(max(1, gpus))], timeout, NICS_ONLY)
    if code != 0:
        return FabricTest(NCCL_NICS, "not-run", f"could not run: {_ended(code, text)}", floor=floor)
    figure, why = parse_all_reduce(text)
    return judge(NCCL_NICS, figure, why, floor, "GB/s")


def ib_loopback(tool: str, hca: str, gpu: int, port: int, floor: float, timeout: float,
                run: Run = run_tool) -> FabricTest:
    """One HCA's GPU-direct loopback: the server in a thread, then the client toward it."""
    name = f"{IB_WRITE_BW} {hca}"
    if not os.access(tool, os.X_OK):
        return FabricTest(name, "not-run", f"{tool} is not installed", floor=floor)
    argv = [tool, "-d", hca, f"--use_cuda={gpu}", "--report_gbits", "-F", "-D", str(IB_SECONDS), "-p", str(port)]
    server: list[tuple[int | None, str]] = []
    thread = threading.Thread(target=lambda: server.append(run(argv, timeout)), daemon=True)
    thread.start()
    listening(port, min(10.0, timeout), thread)  # perftest's client does not wait for its server
    code, text = run([*argv, "127.0.0.1"], timeout)
    thread.join(timeout + 5)
    if code != 0:
        why = _ended(code, text)
        if server and server[0][0] not in (0, None) and server[0][1].strip():
            why += f"; server: {_ended(*server[0])}"
        return FabricTest(name, "not-run", f"could not run: {why}", floor=floor)
    figure, why = parse_ib_write_bw(text)
    return judge(name, figure, why, floor, "Gb/s")


def listening(port: int, timeout: float, server: threading.Thread | None = None) -> bool:
    """Wait until a TCP socket listens on ``port`` (/proc/net/tcp), the server ends, or ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    want = f":{port:04X} "
    while time.monotonic() < deadline and (server is None or server.is_alive()):
        try:
            with open("/proc/net/tcp", encoding="ascii") as fh:
                if any(want in line.split(None, 2)[1] + " " and line.split()[3] == "0A" for line in fh.readlines()[1:]):
                    return True
        except (OSError, IndexError):
            return False
        time.sleep(0.05)
    return False


def _ended(code: int | None, text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    last = lines[-1][:200] if lines else ""
    if code is None:
        return text.strip()[:200]
    return f"exit {code}" + (f": {last}" if last else "")


def hcas(w: Wiring) -> list[str]:
    """``[sweep] ib_hcas``, else every HCA with an active InfiniBand port under the [links] tree."""
    if w.config.sweep.ib_hcas:
        return list(w.config.sweep.ib_hcas)
    from slurm_hooks.probes import ib

    try:
        ports = ib.read_ports(ib.from_config(w.config, w.node).root, counters=False)
    except OSError:
        return []
    return sorted({p["device"] for p in ports if p.get("link_layer") != "Ethernet"
                   and p.get("state") == "ACTIVE"}, key=_natural)


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def run_tests(w: Wiring, timeout: float, run: Run = run_tool) -> list[FabricTest]:
    """Every per-node fabric test the node can run (see the module docstring), each bounded by ``timeout``."""
    cfg = w.config.sweep
    gpus = max(1, w.config.expectations_for(w.node).gpus or 1)
    out = [nccl_nics(cfg.all_reduce_perf, gpus, cfg.nccl_nics_busbw_gbps, timeout, run)]
    devices = hcas(w)
    if not devices:
        out.append(FabricTest(IB_WRITE_BW, "not-run", "no InfiniBand HCA found ([sweep] ib_hcas, [links] tree)",
                              floor=cfg.ib_write_bw_gbps))
    for i, hca in enumerate(devices):
        out.append(ib_loopback(cfg.ib_write_bw, hca, i % gpus, IB_PORT + i, cfg.ib_write_bw_gbps, timeout, run))
    return out


def validate(w: Wiring, report: Report, timeout: float, run: Run = run_tool) -> Report:
    """``report`` (a repair's validation: the node judged afresh, its DCGM diag run) with the per-node
    fabric tests' findings added, each test in the audit log. A figure under its floor is a FAIL
    that takes the node out (reboot, then replace: a reset does not mend a NIC); a test with a floor
    that could not run is a warning the validation reads as unverified; a figure with no floor
    set, or a test without one that could not run, decides nothing (only a floor the site set can
    keep a node out)."""
    import time

    from slurm_hooks.models import Action, Finding, Severity
    from slurm_hooks.remedy.repair.validation import FABRIC

    found = []
    t0 = time.monotonic()
    for test in run_tests(w, max(1.0, min(300.0, timeout)), run):
        w.audit.write("action", node=w.node, action="repair-validate-test", target=w.node, result=test.result,
                      duration_s=round(time.monotonic() - t0, 4), test=test.name, detail=test.detail,
                      **({"figure": test.figure, "unit": test.unit} if test.figure is not None else {}))
        t0 = time.monotonic()
        if test.result == "failed":
            found.append(Finding(FABRIC, Severity.FAIL, Action.REBOOT, f"{test.name} below its floor: {test.detail}",
                                 summary=f"{test.name} below its floor", subject=test.name))
        elif test.result == "not-run" and test.floor > 0:
            found.append(Finding(FABRIC, Severity.WARN, Action.NONE, f"{test.name} not run: {test.detail}",
                                 subject=test.name))
    return replace(report, findings=report.findings + tuple(found), checks_run=report.checks_run + (FABRIC,))

"""How long the no-root tier takes (the developer's inner loop), and its ten slowest tests.

    python bench/bench_tests.py [--workers N] [--no-write] [--check-markers]

Runs the tier ``./scripts/test`` runs on Python 3.9 (no Slurm, no Kubernetes, no GPU) once, with
this interpreter and ``--durations=10``, and writes what it measured (date, machine, commit,
the result line, the wall time, the ten slowest) between the markers of docs/dev/testing.md, so
that no one copies the figures by hand. ``--no-write`` only prints them; ``--check-markers``
only says whether the page still has its markers (exit 1 when not), without running anything.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import subprocess
import sys
import time

from docblock import DocBlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "dev", "testing.md")
DOC = DocBlock(PAGE, "bench_tests")
TIER = ["-m", "not slurm and not k8s and not gpu", "--ignore=tests/bridge", "--ignore=tests/kube"]
_RESULT = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*?) in ([\d.]+)s", re.M)
_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(.+?)\s*$", re.M)
_FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.M)


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPU(s){' ' + model if model else ''}, load average {load:.1f} at the start, "
            f"Python {platform.python_version()}")


def run(workers: int) -> tuple[str, float, float, list[tuple[str, str, str]], list[str], int]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIER, "--durations=10"]
    if workers > 1:
        argv += ["-n", str(workers)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The CPU of pytest and of every process it waited for (its workers, the programs the tests ran):
    # on a shared machine the wall time says as much about the others' load as about the tests.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = _RESULT.findall(r.stdout)
    result = found[-1][0] if found else f"no result line (pytest exited {r.returncode})"
    slowest = _DURATION.findall(r.stdout)[:10]
    return result, wall, cpu, slowest, _FAILED.findall(r.stdout), r.returncode


def _bar(text: str) -> str:
    return text.replace("|", "\\|")


def render(result: str, wall: float, cpu: float, slowest: list[tuple[str, str, str]], workers: int,
           commit: str) -> str:
    tier = " ".join(f'"{a}"' if " " in a else a for a in TIER)
    lines = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at {commit} on "
        f"{platform.node() or 'this machine'} ({machine()}), "
        f"{workers} process(es): `python -m pytest -q -p no:cacheprovider {tier} --durations=10`",
        "",
        f"**{wall:.0f} s** wall, {cpu:.0f} s CPU (user and system, pytest and the processes it waited for); "
        f"{result}.",
        "",
        "| seconds | phase | test |",
        "|---|---|---|",
        *(f"| {secs} | {phase} | `{_bar(test)}` |" for secs, phase, test in slowest),
    ]
    return "\n".join(lines) + "\n"



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="pytest-xdist processes (default: 1, no xdist)")
    ap.add_argument("--no-write", action="store_true", help="print the figures, leave the page alone")
    ap.add_argument("--check-markers", action="store_true", help="only check that the page has its markers")
    args = ap.parse_args()
    if args.check_markers:
        return DOC.check(ROOT)
    commit = "the working tree" if args.no_write else DOC.ready()
    result, wall, cpu, slowest, failed, rc = run(args.workers)
    block = render(result, wall, cpu, slowest, args.workers, commit)
    print(block)
    for name in failed:
        print(f"failed: {name}")
    if not slowest:  # pytest stopped before running the tier (a module that does not import): no figures
        print(f"not written: pytest exited {rc} before the tests ran")
        return rc or 1
    if not args.no_write:
        DOC.write(block, commit)
        print(f"written to {os.path.relpath(PAGE, ROOT)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())

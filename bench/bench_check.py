"""The healthy path's cost, side by side: ``check`` and ``prolog`` on 8 simulated GPUs as the
installed programs run them (``VENV/bin/python -I -m slurm_hooks check --config ...``, Python
start-up included), those programs themselves (what slurmd runs), the interpreter's own empty start
(``python -I -c pass``) and NHC running five checks, in one run on this machine.

    python bench/bench_check.py [--runs 30] [--json] [--no-write] [--check-markers] [--editable]
                                [--nhc TARBALL|TREE] [--venv LABEL=DIR ...]

The checkout is built into a wheel and installed (``--no-deps``) into a fresh venv under a temp dir,
as a node has it: an editable install adds its import hook to every start. ``--editable`` measures
the running venv's own install instead. Every round runs each subject once, in a rotating order, so
a noisy machine slows them alike. Wall time and CPU time (user + system of the process and its
children, from ``wait4``) are reported as medians; "x empty start" is the median, over rounds, of a
subject's wall time over ``python -I -c pass``'s in the same round (the goal: at most 2x). One row
imports, alone, the Python modules the check imports (its ``-X importtime``, less the empty start's and
the package's own): the share of the start-up that is the standard library's; another imports the NVML
probe and ``pynvml``, which a node with GPUs loads on every run and the simulated GPUs do not. The
figures are written between the markers of docs/dev/performance.md, stamped with the checkout's commit
(which must be clean; ``--no-write``, ``--json`` and ``--editable``: only printed). ``--venv before=DIR`` adds another installation's ``DIR/bin/slurm-hooks``
(e.g. the release before, from its own wheel) to compare with. NHC is LBNL NHC from ``--nhc``, else
``$SLURM_HOOKS_NHC_SRC`` (a tarball, or a checkout of mej/nhc), else
``../shared/third_party/lbnl-nhc-*.tar.gz`` beside the checkout, run as
``nhc -c CONF`` with five of its stock checks, marking nothing (``MARK_OFFLINE=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

from docblock import DocBlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "dev", "performance.md")
DOC = DocBlock(PAGE, "bench_check")
EMPTY = "python -I -c pass"
#: The row that imports only the Python modules the check imports (``-m``'s included), nothing of the package's.
FLOOR = "python -I -c 'import' the check's"
NVML = "python -I -c 'import slurm_hooks.probes.nvml, pynvml' (a real node's probe)"
#: An AMD node's probe module (amdsmi itself is imported when the probe runs, and is not here).
AMD = "python -I -c 'import slurm_hooks.probes.amdsmi' (an AMD node's probe, amdsmi aside)"
#: The check started without ``runpy`` (``-c``, not ``-m``), then without ``site`` as well (``-S``, the
#: install's own site-packages put on ``sys.path`` by the command line): what a wrapper could save.
NO_RUNPY = "python -I -c 'from slurm_hooks.entry import main; main()' check (no -m)"
NO_SITE = "python -I -S -c 'sys.path.append(SITE); ...main()' check (no -m, no site)"
#: The start-up asked of the healthy check's two cheaper wrappers.
WRAPPER_GOAL = 2.5
#: What the healthy path may cost, as a multiple of the interpreter's own empty start.
GOAL = 2.0
NHC_CHECKS = """\
* || check_hw_mem_free 1mb
* || check_fs_mount_rw -f /
* || check_file_test -r -w -x -d -k /tmp /var/tmp
* || check_file_test -r -s /etc/passwd /etc/group
* || check_file_test -c -r -w /dev/null /dev/zero
"""


def run_once(argv: list[str], env: dict[str, str], expect_rc: int) -> tuple[float, float]:
    """(wall s, CPU s) of one run, children included."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != expect_rc:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}, expected {expect_rc}: {err.strip()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = sorted(w for w, _ in samples)
    cpus = sorted(c for _, c in samples)
    return {"wall_ms": round(statistics.median(walls) * 1000, 1), "cpu_ms": round(statistics.median(cpus) * 1000, 1),
            "wall_p90_ms": round(walls[max(0, int(len(walls) * 0.9) - 1)] * 1000, 1), "runs": len(walls)}


def wheel_venv(tmp: str) -> str:
    """A venv under ``tmp`` with this checkout installed from its wheel (``--no-deps``); this venv's
    packages (click, jinja2: ``sim init`` and ``install`` need them) come after it through a .pth."""
    wheels = os.path.join(tmp, "wheel")
    # pip sees a checkout on PYTHONPATH (its slurm_hooks.egg-info) as slurm-hooks installed already
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels,
                    ROOT], check=True, stdout=subprocess.DEVNULL, env=env)
    venv = os.path.join(tmp, "wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    wheel = os.path.join(wheels, next(n for n in os.listdir(wheels) if n.endswith(".whl")))
    subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install", "-q",
                    "--no-deps", "--no-index", wheel], check=True, stdout=subprocess.DEVNULL, env=env)
    paths = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(paths, "zz-bench-deps.pth"), "w") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def ratios(samples: list[tuple[float, float]], empty: list[tuple[float, float]]) -> tuple[float, float]:
    """Medians over rounds of this subject's wall and CPU times over the empty start's in the same round."""
    return (round(statistics.median(w / e for (w, _), (e, _) in zip(samples, empty)), 2),
            round(statistics.median(c / max(ec, 1e-6) for (_, c), (_, ec) in zip(samples, empty)), 2))


def render(results: dict[str, dict[str, float]], meta: dict) -> str:
    """The figures as the performance page shows them (a Markdown table and its verdict)."""
    nhc = results.get("NHC, 5 checks")
    head = "| median of {runs} rounds | wall ms | CPU ms | x empty start | CPU x empty start |".format(**meta) + (
        " x NHC |" if nhc else "")
    lines = [f"Python {meta['python']}, {meta['how']}, 8 simulated GPUs, load average {meta['load']:.1f} on "
             f"{meta['cpus']} CPUs (`{meta['command']}`):", "",
             head, "|---|---|---|---|---|" + ("---|" if nhc else "")]
    for n, s in results.items():
        row = f"| `{n}` | {s['wall_ms']:.1f} | {s['cpu_ms']:.1f} | {s['x_empty']:.2f}x | {s['cpu_x_empty']:.2f}x |"
        lines.append(row + (f" {s['wall_ms'] / nhc['wall_ms']:.2f}x |" if nhc else ""))
    worst = max(results[n]["x_empty"] for n in meta["goal_subjects"])
    worst_cpu = max(results[n]["cpu_x_empty"] for n in meta["goal_subjects"])
    lines += ["", f"The healthy check and prolog as the programs run them: at most {worst:.2f}x the empty start's "
              f"wall time ({worst_cpu:.2f}x its CPU time; goal: {GOAL:.1f}x, {'met' if worst <= GOAL else 'not met'})."]
    floor = next((s for n, s in results.items() if n.startswith(FLOOR)), None)
    if floor:
        lines[-1] += (f" Python's own modules that the check imports, imported alone, take {floor['x_empty']:.2f}x "
                      f"({floor['cpu_x_empty']:.2f}x its CPU time).")
    cheaper = [(n, results[n]) for n in (NO_RUNPY, NO_SITE) if n in results]
    if cheaper:
        lines[-1] += " Started as a wrapper could start it: " + "; ".join(
            f"{'without `-m`' if n == NO_RUNPY else 'without `-m` and `site`'} {s['x_empty']:.2f}x "
            f"({s['cpu_x_empty']:.2f}x its CPU time)" for n, s in cheaper) + (
            f" (asked: {WRAPPER_GOAL:.1f}x, judged on CPU time, the steadier on a loaded machine: "
            f"{'met' if min(s['cpu_x_empty'] for _, s in cheaper) <= WRAPPER_GOAL else 'not met'}).")
    nvml = results.get(NVML)
    if nvml:
        lines[-1] += (f" A node with GPUs also imports the NVML probe and pynvml, which alone take "
                      f"{nvml['x_empty']:.2f}x ({nvml['cpu_x_empty']:.2f}x its CPU time): the simulated GPUs here do not.")
    amd = results.get(AMD)
    if amd:
        lines[-1] += (f" An AMD node imports the AMD probe instead: {amd['x_empty']:.2f}x ({amd['cpu_x_empty']:.2f}x "
                      "its CPU time), before amdsmi itself.")
    return "\n".join(lines) + "\n"



def imported(argv: list[str], env: dict[str, str]) -> list[str]:
    """The modules ``argv`` imports, in order (``python -X importtime``)."""
    err = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, check=True).stderr
    return [line.rpartition("|")[2].strip() for line in err.splitlines()
            if line.startswith("import time:") and not line.rstrip().endswith("imported package")]


def stdlib_imports(subject: tuple[list[str], dict[str, str]], empty: tuple[list[str], dict[str, str]]) -> list[str]:
    """What the check imports beyond the empty start, less the package's own modules: the part of its
    start-up the package cannot cut (a floor: ``python -I -c "import ..."`` of them is a row of its own)."""
    run_once(*subject, expect_rc=0)  # a warm run: the parsed config kept, as every later one finds it
    own = set(imported(*empty))
    return [m for m in imported(*subject) if m not in own and m.partition(".")[0] != "slurm_hooks"]


def find_nhc(explicit: str | None) -> str | None:
    """--nhc, else $SLURM_HOOKS_NHC_SRC (a tarball or a mej/nhc tree), else the tarball beside the checkout."""
    from slurm_hooks.lab import nhc

    return explicit or nhc.find_source(ROOT)


def nhc_subject(source: str, tmp: str) -> tuple[list[str], dict[str, str]]:
    from slurm_hooks.lab.nhc import NhcTree

    tree = NhcTree(os.path.join(tmp, "nhc-tree"))
    tree.unpack(source)  # a tarball or a tree, driver and helpers made executable
    nhc = tree.src
    conf = os.path.join(tmp, "nhc-bench.conf")
    with open(conf, "w") as fh:
        fh.write(NHC_CHECKS)
    argv = [os.path.join(nhc, "nhc"), "-c", conf, f"INCDIR={nhc}/scripts", f"HELPERDIR={nhc}/helpers",
            "HOSTNAME=bench1", "NHC_RM=slurm", "MARK_OFFLINE=0", f"LOGFILE={tmp}/nhc.log"]
    return argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nhc", help="LBNL NHC tarball or tree (default: $SLURM_HOOKS_NHC_SRC, else "
                                  "../shared/third_party/lbnl-nhc-*.tar.gz)")
    ap.add_argument("--venv", action="append", default=[], metavar="LABEL=DIR",
                    help="another installation to compare with: DIR/bin/slurm-hooks")
    ap.add_argument("--editable", action="store_true",
                    help="measure the running venv's own install (maybe editable) instead of a wheel of the checkout")
    ap.add_argument("--no-write", action="store_true", help="print the figures, leave the page alone")
    ap.add_argument("--check-markers", action="store_true", help="only check that the page has its markers")
    args = ap.parse_args()
    if args.check_markers:
        raise SystemExit(DOC.check(ROOT))
    commit = "" if args.no_write or args.json or args.editable else DOC.ready()
    with tempfile.TemporaryDirectory() as tmp:
        bindir = os.path.join(wheel_venv(tmp), "bin") if not args.editable else os.path.dirname(sys.executable)
        here, python = os.path.join(bindir, "slurm-hooks"), os.path.join(bindir, "python")
        if not os.path.exists(here):
            raise SystemExit(f"{here} not found: run this with the python of a venv that has slurm-hooks")

        def setup(label: str, exe: str) -> tuple[dict[str, str], dict[str, str]]:
            """A config and 8 simulated GPUs of this installation's own (its sim format)."""
            d = os.path.join(tmp, label)
            os.makedirs(d)
            cfg = os.path.join(d, "config.toml")
            with open(cfg, "w") as fh:
                fh.write(f'[gpu]\nbackend = "sim"\nsim_dir = "{d}/sim"\n[log]\naudit = "{d}/audit.jsonl"\n'
                         f'[state]\ndir = "{d}/state"\n[expect]\ngpus = 8\n')
            env = {"PATH": "/usr/bin:/bin", "SLURM_HOOKS_CONFIG": cfg, "SLURMD_NODENAME": "bench1"}
            subprocess.run([exe, "sim", "init", "--node", "bench1", "--gpus", "8"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            return env, {**env, "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}

        env, job_env = setup("this", here)
        cfg = env["SLURM_HOOKS_CONFIG"]
        prefix = os.path.join(tmp, "opt")
        subprocess.run([here, "install", "--prefix", prefix, "--config", cfg], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        slurmd_env = {"SLURMD_NODENAME": "bench1"}  # slurmd gives its programs no PATH
        slurmd_job_env = {**slurmd_env, "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}
        as_wrapper = [python, "-I", "-m", "slurm_hooks"]
        subjects: dict[str, tuple[list[str], dict[str, str]]] = {
            EMPTY: ([python, "-I", "-c", "pass"], slurmd_env),
            "python -I -m slurm_hooks check": ([*as_wrapper, "check", "--config", cfg], slurmd_env),
            "python -I -m slurm_hooks prolog, 8 GPUs": ([*as_wrapper, "prolog", "--config", cfg], slurmd_job_env),
            "slurm-hooks-healthcheck (installed program)": ([os.path.join(prefix, "bin", "slurm-hooks-healthcheck")],
                                                            slurmd_env),
            "slurm-hooks-prolog (installed program)": ([os.path.join(prefix, "bin", "slurm-hooks-prolog")],
                                                       slurmd_job_env),
        }
        site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        entry = "from slurm_hooks.entry import main; main()"
        subjects[NO_RUNPY] = ([python, "-I", "-c", entry, "check", "--config", cfg], slurmd_env)
        if not args.editable:  # an editable install is found through a .pth file, which -S leaves unread
            subjects[NO_SITE] = ([python, "-I", "-S", "-c", f"import sys; sys.path.append({site!r}); {entry}",
                                  "check", "--config", cfg], slurmd_env)
        goal_subjects = ["python -I -m slurm_hooks check", "python -I -m slurm_hooks prolog, 8 GPUs"]
        stdlib = stdlib_imports(subjects["python -I -m slurm_hooks check"], subjects[EMPTY])
        subjects[f"{FLOOR} {len(stdlib)} stdlib modules"] = (
            [python, "-I", "-c", "import " + ", ".join(stdlib)], slurmd_env)
        if subprocess.run([python, "-I", "-c", "import pynvml"], env=slurmd_env).returncode == 0:
            # what a node with GPUs adds to this: the NVML probe imports pynvml (and ctypes) on every run
            subjects[NVML] = ([python, "-I", "-c", "import slurm_hooks.probes.nvml, pynvml"], slurmd_env)
        subjects[AMD] = ([python, "-I", "-c", "import slurm_hooks.probes.amdsmi"], slurmd_env)
        for spec in args.venv:
            label, _, vdir = spec.partition("=")
            exe = os.path.join(vdir, "bin", "slurm-hooks")
            venv_env, venv_job_env = setup(label, exe)
            other = [os.path.join(vdir, "bin", "python"), "-I", "-m", "slurm_hooks"]
            other_cfg = venv_env["SLURM_HOOKS_CONFIG"]
            subjects[f"check ({label})"] = ([*other, "check", "--config", other_cfg], slurmd_env)
            subjects[f"prolog, 8 GPUs ({label})"] = ([*other, "prolog", "--config", other_cfg], slurmd_job_env)
        tarball = find_nhc(args.nhc)
        if tarball:
            subjects["NHC, 5 checks"] = nhc_subject(tarball, tmp)
        names = list(subjects)
        samples: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for n in names:  # warm the page cache and the .pyc files
            run_once(*subjects[n], expect_rc=0)
        for i in range(args.runs):
            for n in names[i % len(names):] + names[:i % len(names)]:
                samples[n].append(run_once(*subjects[n], expect_rc=0))
    results = {}
    for n, s in samples.items():
        x_wall, x_cpu = ratios(s, samples[EMPTY])
        results[n] = {**summary(s), "x_empty": x_wall, "cpu_x_empty": x_cpu}
    meta = {"python": sys.version.split()[0], "runs": args.runs, "nhc": os.path.basename(tarball) if tarball else None,
            "how": "the running venv's install" if args.editable else "wheel of the checkout in a fresh venv",
            "load": os.getloadavg()[0], "cpus": os.cpu_count(),
            "command": shlex.join(["python", "bench/bench_check.py", *sys.argv[1:]]), "goal_subjects": goal_subjects, "goal": GOAL}
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
        return
    block = render(results, meta)
    print(block)
    if commit:
        DOC.write(block, commit)
        print(f"written to {os.path.relpath(PAGE, ROOT)}")


if __name__ == "__main__":
    main()

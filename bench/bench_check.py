"""The healthy path's cost, side by side: ``slurm-hooks check`` and ``prolog`` on 8 simulated GPUs
(Python start-up included), the program ``slurm-hooks install`` lays (what slurmd runs), and NHC
running five checks, in one run on this machine.

    python bench/bench_check.py [--runs 30] [--json] [--nhc TARBALL|TREE] [--venv LABEL=DIR ...]

Every round runs each subject once, in a rotating order, so a noisy machine slows them alike.
Wall time and CPU time (user + system of the process and its children, from ``wait4``) are
reported as medians. ``--venv before=DIR`` adds another installation's ``DIR/bin/slurm-hooks``
(e.g. the release before, from its own wheel) to compare with. NHC is LBNL NHC from ``--nhc``, else
``$SLURM_HOOKS_NHC_SRC`` (a tarball, or a checkout of mej/nhc), else
``../shared/third_party/lbnl-nhc-*.tar.gz`` beside the checkout, run as
``nhc -c CONF`` with five of its stock checks, marking nothing (``MARK_OFFLINE=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    args = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "slurm-hooks")
    if not os.path.exists(here):
        raise SystemExit(f"{here} not found: run this with the python of a venv that has slurm-hooks")
    with tempfile.TemporaryDirectory() as tmp:
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
        subjects: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "check": ([here, "check"], env),
            "check, installed program": ([os.path.join(prefix, "bin", "slurm-hooks-healthcheck")],
                                         {"SLURMD_NODENAME": "bench1"}),
            "prolog, 8 GPUs": ([here, "prolog"], job_env),
            "prolog, installed program": ([os.path.join(prefix, "bin", "slurm-hooks-prolog")],
                                          {"SLURMD_NODENAME": "bench1", "SLURM_JOB_ID": "1",
                                           "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}),
        }
        for spec in args.venv:
            label, _, vdir = spec.partition("=")
            exe = os.path.join(vdir, "bin", "slurm-hooks")
            venv_env, venv_job_env = setup(label, exe)
            subjects[f"check ({label})"] = ([exe, "check"], venv_env)
            subjects[f"prolog, 8 GPUs ({label})"] = ([exe, "prolog"], venv_job_env)
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
    results = {n: summary(s) for n, s in samples.items()}
    meta = {"python": sys.version.split()[0], "runs": args.runs, "nhc": os.path.basename(tarball) if tarball else None}
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
        return
    nhc = results.get("NHC, 5 checks")
    print(f"Python {meta['python']}, {args.runs} rounds, 8 simulated GPUs; medians")
    print(f"  {'':<32} {'wall ms':>9} {'CPU ms':>8}" + ("   wall / NHC's" if nhc else ""))
    for n, s in results.items():
        ratio = f"   {s['wall_ms'] / nhc['wall_ms']:.2f}x" if nhc else ""
        print(f"  {n:<32} {s['wall_ms']:9.1f} {s['cpu_ms']:8.1f}{ratio}")


if __name__ == "__main__":
    main()

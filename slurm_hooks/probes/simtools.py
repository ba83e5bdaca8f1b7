"""Stand-ins for ``nvidia-smi``, ``systemctl``, ``dcgmi``, ``amd-smi`` and ``rvs`` that act on the simulated GPUs.

The repair worker resets GPUs, stops and restarts services, and validates through these
programs on a real node; on the testbed (and for an admin's rehearsal) the same code runs
the same argv against the sim's state, so a reset that hangs, a service left stopped, or a
latent fault only a DCGM diagnostic finds can be shown end to end:

- ``nvidia-smi -i K -pm 0|1`` and ``nvidia-smi --gpu-reset -i K`` (a reset waits the GPU's
  ``reset_hang_s`` first: ``sim inject --reset-hang S``);
- ``systemctl stop|start|is-active NAME`` (the node's services in the sim state);
- ``dcgmi diag -r L [-j]``: the sim's tests for level L, taking its scaled-down time; a GPU with
  ``sim inject --diag-failure L`` fails; with the ``nvidia-dcgm`` service stopped the host
  engine is not reachable, as on a real node;
- on an AMD node (``sim init --vendor amd``): ``amd-smi reset -G -g K [K ...]`` (amd-smi's own
  argv: ``reset`` takes the GPUs with ``-g/--gpu`` and the reset with ``-G/--gpureset``), and
  ``rvs -r L``, the ROCm Validation Suite's run at level L, failing as ``dcgmi diag`` does. Each
  vendor's tool refuses the other vendor's node, as the real ones find no GPU of theirs there.

Run as ``<tool> [--sim-dir DIR] [--node NODE] ARGS``; the node defaults to
``$SLURMD_NODENAME`` (hooks and jobs have it), else the only node in the sim dir.
:func:`install` writes them as executables for a config's ``[dcgm] dcgmi`` and
``[repair] nvidia_smi`` / ``systemctl``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Sequence

from slurm_hooks.errors import SimStateError
from slurm_hooks.probes import sim

TOOLS = ("nvidia-smi", "systemctl", "dcgmi", "amd-smi", "rvs")
#: The service that runs DCGM's host engine: stopped, dcgmi cannot reach it.
DCGM_SERVICE = "nvidia-dcgm"


def argv(tool: str, sim_dir: str, node: str | None = None, python: str | None = None) -> list[str]:
    """The argv prefix that runs one stand-in (no file needed)."""
    from slurm_hooks.runner import python_argv

    return python_argv(__name__, tool, "--sim-dir", sim_dir, *(["--node", node] if node else []), python=python)


def install(directory: str, sim_dir: str, python: str | None = None) -> dict[str, str]:
    """Write the stand-ins into ``directory`` (mode 0755); returns tool -> path."""
    from slurm_hooks import fsutil

    os.makedirs(directory, mode=0o755, exist_ok=True)
    paths = {}
    for tool in TOOLS:
        path = os.path.join(directory, tool)
        command = " ".join(shlex.quote(a) for a in argv(tool, sim_dir, python=python))
        fsutil.atomic_write(path, f"#!/bin/sh\n# slurm-hooks sim stand-in for {tool}\nexec {command} \"$@\"\n",
                            mode=0o755)
        paths[tool] = path
    return paths


def main(args: Sequence[str]) -> int:
    args = list(args)
    if not args or args[0] not in TOOLS:
        print(f"usage: {{{','.join(TOOLS)}}} [--sim-dir DIR] [--node NODE] ARGS", file=sys.stderr)
        return 2
    tool, rest = args[0], args[1:]
    sim_dir, node = "", os.environ.get("SLURMD_NODENAME", "")
    while len(rest) >= 2 and rest[0] in ("--sim-dir", "--node"):
        if rest[0] == "--sim-dir":
            sim_dir = rest[1]
        else:
            node = rest[1]
        rest = rest[2:]
    try:
        node = node or _only_node(sim_dir)
        return {"nvidia-smi": _nvidia_smi, "systemctl": _systemctl, "dcgmi": _dcgmi, "amd-smi": _amd_smi,
                "rvs": _rvs}[tool](sim_dir, node, rest)
    except SimStateError as exc:
        print(f"{tool} (slurm-hooks sim): {exc}", file=sys.stderr)
        return 1


def _only_node(sim_dir: str) -> str:
    try:
        names = sorted(n[:-5] for n in os.listdir(sim_dir) if n.endswith(".json"))
    except OSError as exc:
        raise SimStateError(f"{sim_dir}: {exc.strerror}") from None
    if len(names) != 1:
        raise SimStateError(f"which node? set SLURMD_NODENAME or --node ({len(names)} nodes in {sim_dir})")
    return names[0]


def _gpu_index(rest: list[str]) -> int:
    if "-i" not in rest or rest.index("-i") + 1 >= len(rest) or not rest[rest.index("-i") + 1].isdigit():
        raise SimStateError("nvidia-smi: give the GPU as -i INDEX")
    return int(rest[rest.index("-i") + 1])


def _amd(sim_dir: str, node: str) -> bool:
    return sim.read(sim_dir, node).get("vendor") == "amd"


def _reset(sim_dir: str, node: str, index: int) -> str:
    """Reset one simulated GPU after its ``reset_hang_s``; "" when done, else why not."""
    hang = float(sim.gpu_entry(sim.read(sim_dir, node), index).get("reset_hang_s") or 0)
    if hang > 0:
        time.sleep(hang)
    try:
        sim.reset(sim_dir, node, index)
    except sim.ResetFailed as exc:
        return str(exc)
    return ""


def _nvidia_smi(sim_dir: str, node: str, rest: list[str]) -> int:
    if _amd(sim_dir, node):  # nvidia-smi's own words where no NVIDIA driver runs
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
              "the latest NVIDIA driver is installed and running.", file=sys.stderr)
        return 9
    index = _gpu_index(rest)
    if "--gpu-reset" in rest:
        failed = _reset(sim_dir, node, index)
        if failed:
            print(f"GPU {index}: {failed}", file=sys.stderr)
            return 1
        print(f"GPU 0000:{index:02x}:00.0 was successfully reset.")
        return 0
    if "-pm" in rest:
        on = rest[rest.index("-pm") + 1:rest.index("-pm") + 2] == ["1"]

        def change(state: dict) -> None:
            sim.gpu_entry(state, index)["persistence_mode"] = on

        sim.update(sim_dir, node, change)
        print(f"Persistence mode set to {'ENABLED' if on else 'DISABLED'} for GPU {index}.")
        return 0
    raise SimStateError(f"nvidia-smi: not simulated: {' '.join(rest)}")


def _systemctl(sim_dir: str, node: str, rest: list[str]) -> int:
    if len(rest) != 2 or rest[0] not in ("start", "stop", "restart", "is-active"):
        raise SimStateError(f"systemctl: not simulated: {' '.join(rest)}")
    verb, name = rest
    if verb == "is-active":
        state = sim.service_state(sim.read(sim_dir, node), name)
        print(state)
        return 0 if state == "active" else 3
    sim.set_service(sim_dir, node, name, verb != "stop")
    return 0


def _dcgmi(sim_dir: str, node: str, rest: list[str]) -> int:
    if len(rest) < 3 or rest[0] != "diag" or rest[1] != "-r" or not rest[2].isdigit():
        raise SimStateError(f"dcgmi: not simulated: {' '.join(rest)} (only: diag -r LEVEL [-j])")
    level = int(rest[2])
    state = sim.read(sim_dir, node)
    if sim.service_state(state, DCGM_SERVICE) != "active" or state.get("vendor") == "amd":  # no host engine
        print("Error: unable to establish a connection to the specified host: localhost", file=sys.stderr)
        return 255
    doc = sim.diag(state, level)
    time.sleep(sim.diag_seconds(state, level))
    if "-j" in rest:
        print(json.dumps(doc))
    else:
        for test in doc["DCGM Diagnostic"]["test_categories"][0]["tests"]:
            failed = [r["entity_id"] for r in test["results"] if r["status"] == "Fail"]
            print(f"| {test['name']:<20} | {'Fail - GPU ' + ','.join(map(str, failed)) if failed else 'Pass'}")
    failing = any(r["status"] == "Fail" for t in doc["DCGM Diagnostic"]["test_categories"][0]["tests"]
                  for r in t["results"])
    return 226 if failing else 0


def _amd_smi(sim_dir: str, node: str, rest: list[str]) -> int:
    """``amd-smi reset -G -g K [K ...]`` (the options in either order, long or short)."""
    if not _amd(sim_dir, node):
        print("AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded (no amdgpu GPU on this node)", file=sys.stderr)
        return 1
    words = rest[1:]
    gpus = [int(w) for w in _after(words, ("-g", "--gpu")) if w.isdigit()]
    if not rest or rest[0] != "reset" or not {"-G", "--gpureset"} & set(words) or not gpus:
        raise SimStateError(f"amd-smi: not simulated: {' '.join(rest)} (only: reset -G -g GPU [GPU ...])")
    status = 0
    for index in gpus:
        failed = _reset(sim_dir, node, index)
        if failed:
            print(f"GPU: {index}\n    RESET: Unable to reset GPU {index}: {failed}", file=sys.stderr)
            status = 1
        else:
            print(f"GPU: {index}\n    RESET: Successfully reset GPU {index}")
    return status


def _after(words: list[str], flags: tuple[str, ...]) -> list[str]:
    """The values after the first of ``flags`` up to the next option."""
    at = next((i for i, w in enumerate(words) if w in flags), None)
    if at is None:
        return []
    out = []
    for w in words[at + 1:]:
        if w.startswith("-"):
            break
        out.append(w)
    return out


def _rvs(sim_dir: str, node: str, rest: list[str]) -> int:
    """``rvs -r LEVEL``: the sim's tests of that level (DCGM's set, levels above 4 run 4's) on every
    GPU, a [RESULT] line each; a GPU's latent fault found at this level or below says FAIL, exit 1."""
    if len(rest) < 2 or rest[0] != "-r" or not rest[1].isdigit():
        raise SimStateError(f"rvs: not simulated: {' '.join(rest)} (only: -r LEVEL)")
    state = sim.read(sim_dir, node)
    if state.get("vendor") != "amd":
        print("RVS-ERROR: no supported AMD GPU found (hsa_init found no agent)", file=sys.stderr)
        return 1
    level = min(max(int(rest[1]), 1), max(sim.DIAG_TESTS))
    doc = sim.diag(state, level)
    time.sleep(sim.diag_seconds(state, level))
    failing = False
    for test in doc["DCGM Diagnostic"]["test_categories"][0]["tests"]:
        for r in test["results"]:
            gpu = sim.gpu_entry(state, r["entity_id"])
            said = "pass: TRUE" if r["status"] == "Pass" else \
                f"FAIL ({r['warnings'][0]['warning'] if r.get('warnings') else r['status']})"
            failing = failing or r["status"] != "Pass"
            print(f"[RESULT] [{time.monotonic():10.1f}] Action name :{test['name']} Module name :sim "
                  f"GPU ID :{gpu.get('uuid', r['entity_id'])} {said}")
    return 1 if failing else 0

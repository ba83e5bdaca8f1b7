"""Only the client module imports ``kubernetes``, and only when it is used."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRIDGE = os.path.join(ROOT, "slurm_hooks", "bridge")
_IMPORT = re.compile(r"^\s*(import kubernetes|from kubernetes)", re.M)


def test_only_kubeclient_imports_kubernetes():
    importers = []
    for name in sorted(os.listdir(BRIDGE)):
        if name.endswith(".py"):
            with open(os.path.join(BRIDGE, name), encoding="utf-8") as fh:
                if _IMPORT.search(fh.read()):
                    importers.append(name)
    assert importers == ["kubeclient.py"]
    for command in ("bridge.py", "render.py"):
        with open(os.path.join(ROOT, "slurm_hooks", "commands", command), encoding="utf-8") as fh:
            assert not _IMPORT.search(fh.read())


def test_importing_the_bridge_does_not_load_kubernetes():
    code = (
        "import sys\n"
        "import slurm_hooks.bridge.reconciler, slurm_hooks.bridge.kubeclient, slurm_hooks.bridge.settings\n"
        "import slurm_hooks.commands.bridge, slurm_hooks.commands.render\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr


def test_node_side_commands_do_not_load_the_bridge():
    code = (
        "import sys\n"
        "import slurm_hooks.cli\n"
        "for name in ('check', 'prolog', 'epilog'):\n"
        "    slurm_hooks.cli.cli.get_command(None, name)\n"
        "loaded = [m for m in sys.modules if m.startswith(('kubernetes', 'slurm_hooks.bridge'))]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr

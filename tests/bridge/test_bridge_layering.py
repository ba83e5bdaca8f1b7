"""The client module imports ``kubernetes`` only when it is used, and node-side commands load no bridge.

Which modules may import ``kubernetes`` at all is a contract in ``.importlinter``
(kubernetes-in-kubeclient-only, no-k8s-on-nodes); these tests check what a contract
cannot: that the imports are lazy.
"""

from __future__ import annotations

import os
import subprocess
import sys

from paths import ROOT


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

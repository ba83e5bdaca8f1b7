"""What a real ``slurm-hooks bridge`` process against kmock reads: a kubeconfig, a fake Slurm, a config.toml."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig whose current context is the API server at ``server_url`` (a token user: kmock checks none)."""
    path.write_text(textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters: [{{name: kmock, cluster: {{server: "{server_url}"}}}}]
        users: [{{name: bridge, user: {{token: test}}}}]
        contexts: [{{name: kmock, context: {{cluster: kmock, user: bridge}}}}]
        current-context: kmock
    """))
    return path


def write_bridge_site(tmp_path: Path, server_url: str, nodes: list[str], extra: str = "", **bridge: Any) -> str:
    """Write a bridge's site into ``tmp_path``; return the path of its ``config.toml``.

    ``bin/``: an ``scontrol`` that prints ``nodes`` (``scontrol show node -o`` lines, kept in
    ``nodes.txt``) and takes every ``update``, and an ``squeue`` with no job on any node;
    ``kubeconfig`` for ``server_url``; ``config.toml``: the audit log in ``audit.jsonl``, Slurm by
    that ``bin/``, ``[bridge]`` with the kubeconfig and the ``bridge`` keys, then ``extra`` (more sections).
    """
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "nodes.txt").write_text("".join(f"{line}\n" for line in nodes))
    for tool, body in (("scontrol", f'[ "$1" = update ] && exit 0\ncat {tmp_path}/nodes.txt'), ("squeue", "exit 0")):
        (bindir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / tool).chmod(0o755)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server_url)
    config = tmp_path / "config.toml"
    config.write_text(textwrap.dedent(f"""\
        [log]
        audit = "{tmp_path}/audit.jsonl"
        [slurm]
        backend = "scontrol"
        bin_dir = "{bindir}"
        [bridge]
        kubeconfig = "{kubeconfig}"
    """) + "".join(f"{key} = {json.dumps(value)}\n" for key, value in bridge.items()) + extra)
    return str(config)

#!/usr/bin/env python3
"""Write the checkout's copies of what ``slurm-hooks install`` lays, from the same templates.

The wheel's package data is the one source (``slurm_hooks/templates/install``, ``templates/nhc``);
these copies keep the repository's layout readable for a reviewer and a site that deploys from
git: ``healthcheck/``, ``prolog.d/``, ``epilog.d/`` hold the programs slurmd runs, ``conf/`` the
example config and the watcher's unit, all as laid by the default install::

    /opt/slurm-hooks/venv-<version>/bin/slurm-hooks install --prefix /opt/slurm-hooks \\
        --config /etc/slurm-hooks/config.toml

``tests/install/test_checkout_layout.py`` fails when a copy drifts from what install lays.

    python tools/gen_checkout_layout.py [--check]
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from slurm_hooks import config  # noqa: E402
from slurm_hooks.install import layout  # noqa: E402

#: checkout path -> the installed file it copies (relative to the version dir); None: the example config
COPIES = {
    "healthcheck/slurm-hooks-healthcheck": layout.program_rel("healthcheck"),
    "prolog.d/50-slurm-hooks": layout.program_rel("prolog"),
    "epilog.d/50-slurm-hooks": layout.program_rel("epilog"),
    "conf/slurm-hooks-watch.service": layout.UNIT,
    "conf/slurm_hooks.nhc": layout.NHC,
    "conf/config.toml": None,
}


def expected() -> dict[str, tuple[str, int]]:
    """checkout path -> (text, mode), rendered for the default prefix and config."""
    example = layout.example_config()
    cfg = config.parse(example, "conf/config.toml")
    laid = layout.render(layout.Inputs(
        prefix=layout.DEFAULT_PREFIX, python=os.path.join(layout.venv_path(), "bin", "python"),
        config=layout.DEFAULT_CONFIG, state_dir=cfg.state.dir, audit=cfg.log.audit,
        textfile_dir=cfg.metrics.textfile_dir, scontrol=os.path.join(cfg.slurm.bin_dir, "scontrol")))
    return {path: ((example, 0o644) if rel is None else laid.files[rel]) for path, rel in COPIES.items()}


def drift(root: str = REPO) -> list[str]:
    """The copies under ``root`` that differ from what install lays (missing, text or mode)."""
    out = []
    for path, (text, mode) in expected().items():
        full = os.path.join(root, path)
        try:
            with open(full, encoding="utf-8") as fh:
                have = fh.read()
        except OSError:
            out.append(f"{path}: missing")
            continue
        if have != text:
            out.append(f"{path}: differs from what install lays")
        elif os.stat(full).st_mode & 0o777 != mode:
            out.append(f"{path}: mode {os.stat(full).st_mode & 0o777:o}, install lays {mode:o}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report drift (exit 1 when any)")
    args = ap.parse_args()
    if args.check:
        problems = drift()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for path, (text, mode) in expected().items():
        full = os.path.join(REPO, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(full, mode)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The checkout's healthcheck/, prolog.d/, epilog.d/ and conf/ are what ``install`` lays, byte for byte."""

from __future__ import annotations

import os
import shutil
import sys

from paths import ROOT as REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import gen_checkout_layout  # noqa: E402


def test_the_checkout_copies_match_what_install_lays_for_the_default_prefix():
    assert gen_checkout_layout.drift() == []


def test_a_copy_edited_by_hand_is_reported_as_drift(tmp_path):
    for path in gen_checkout_layout.COPIES:
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        shutil.copy2(os.path.join(REPO, path), tmp_path / path)
    assert gen_checkout_layout.drift(str(tmp_path)) == []
    with open(tmp_path / "prolog.d" / "50-slurm-hooks", "a", encoding="utf-8") as fh:
        fh.write("exec /bin/true\n")
    os.remove(tmp_path / "conf" / "config.toml")
    assert gen_checkout_layout.drift(str(tmp_path)) == [
        "prolog.d/50-slurm-hooks: differs from what install lays",
        "conf/config.toml: missing",
    ]


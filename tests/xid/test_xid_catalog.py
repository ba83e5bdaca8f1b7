"""The generated XID catalogue: matches NVIDIA's CSV and carries the curated actions."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from paths import ROOT

from slurm_hooks.models import Action, Severity
from slurm_hooks.xid import catalog as xid_catalog
from slurm_hooks.xid.catalog import CATALOG, lookup

CSV = os.path.join(ROOT, "tests", "fixtures", "xid", "xid-catalog.csv")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_xid_table", os.path.join(ROOT, "tools", "gen_xid_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.path.exists(CSV), reason="catalogue CSV not present")
def test_committed_module_equals_generator_output():
    with open(xid_catalog.__file__, encoding="utf-8") as fh:
        committed = fh.read()
    assert _generator().render(CSV) == committed, "regenerate: python tools/gen_xid_table.py " + CSV


def test_header_names_source_and_says_generated():
    doc = xid_catalog.__doc__
    assert "tools/gen_xid_table.py" in doc
    assert "Xid-Catalog.xlsx" in doc and "2025-10-17" in doc and "e5419d11b222" in doc
    assert "Do not edit" in doc


def test_xid79_fallen_off_the_bus_suggests_a_reboot_first():
    # NVIDIA: reboot the node; replacement is the repair ladder's rung when it survives one.
    info = lookup(79)
    assert info.description == "GPU has fallen off the bus"
    assert info.immediate == "RESTART_BM"
    assert (info.action, info.severity) == (Action.REBOOT, Severity.FAIL)


def test_xid48_double_bit_ecc_suggests_reset():
    info = lookup(48)
    assert info.description == "Double Bit ECC Error"
    assert (info.action, info.severity) == (Action.RESET, Severity.FAIL)


def test_xid13_application_error_only_tells_the_user():
    info = lookup(13)
    assert info.mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"
    assert (info.action, info.severity) == (Action.NONE, Severity.WARN)


def test_xid119_gsp_timeout_suggests_reset():
    info = lookup(119)
    assert info.description == "GSP RPC Timeout"
    assert (info.action, info.severity) == (Action.RESET, Severity.FAIL)


def test_every_code_in_the_csv_has_an_entry_including_unused_ones():
    assert sorted(CATALOG) == list(range(1, 173))
    assert lookup(1).description == "Unused"
    assert lookup(1).action is Action.WARN


def test_unknown_code_is_not_in_the_catalogue():
    assert lookup(9999) is None


def test_severity_follows_action_for_every_entry():
    for info in CATALOG.values():
        expected = Severity.FAIL if info.action.takes_node_out else Severity.WARN
        assert info.severity is expected, info.code


def test_curated_overrides_win_over_buckets():
    overrides = _generator().OVERRIDES
    for code, action in overrides.items():
        assert CATALOG[code].action is Action(action), code
    assert CATALOG[74].immediate == "WORKFLOW_NVLINK_ERR" and CATALOG[74].action is Action.RESET
    assert all(CATALOG[c].action is Action.RESET for c in range(144, 151))
    assert CATALOG[64].action is Action.REPLACE and CATALOG[143].action is Action.REPLACE
    assert CATALOG[92].action is Action.WARN and CATALOG[63].action is Action.NONE


def test_multiline_cells_are_flattened():
    assert "\n" not in "".join(i.mnemonic + i.description + i.investigatory for i in CATALOG.values())
    assert lookup(45).investigatory == "Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)"


def test_generator_refuses_an_unmapped_bucket(tmp_path):
    csv_path = tmp_path / "catalog.csv"
    csv_path.write_text(
        "Type (XID),Code,Mnemonic,Description,Applies to A100,Applies to H100,Applies to B100,Applies to GB200,"
        "Resolution Bucket (Immediate Action),Resolution Bucket (Investigatory Action),Xid 154 linkage,Trigger Conditions\n"
        "XID,200,NEW_THING,Something new,NO,NO,YES,YES,REPLACE_THE_MOON,,,\n",
        encoding="utf-8",
    )
    with pytest.raises(SystemExit, match="REPLACE_THE_MOON"):
        _generator().render(str(csv_path))


def test_generator_writes_the_module_it_renders(tmp_path):
    if not os.path.exists(CSV):
        pytest.skip("catalogue CSV not present")
    out = tmp_path / "catalog.py"
    assert _generator().main([CSV, "-o", str(out)]) == 0
    namespace: dict = {}
    exec(compile(out.read_text(encoding="utf-8"), str(out), "exec"), namespace)
    assert namespace["lookup"](79).action is Action.REBOOT


def test_import_is_cheap():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import slurm_hooks.xid.catalog"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stderr
    line = next(line for line in out.splitlines() if line.rstrip().endswith("slurm_hooks.xid.catalog"))
    self_us = int(line.split("|")[0].split(":")[1])
    assert self_us < 50_000, line

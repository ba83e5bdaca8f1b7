"""Slurm hostlist expressions and globs, as config groups use them."""

from __future__ import annotations

import pytest

from slurm_hooks.slurm import hostlist


@pytest.mark.parametrize("expr, hosts", [
    ("gpu017", ["gpu017"]),
    ("gpu[1-3]", ["gpu1", "gpu2", "gpu3"]),
    ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("gpu[9-10]", ["gpu9", "gpu10"]),
    ("gpu[1-2,5,07-08]", ["gpu1", "gpu2", "gpu5", "gpu07", "gpu08"]),
    ("gpu[5]", ["gpu5"]),
    ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
    ("r[1-2]n[1-2]x", ["r1n1x", "r1n2x", "r2n1x", "r2n2x"]),
    ("a[1-2],b3,c[5]", ["a1", "a2", "b3", "c5"]),
    ("gpu[1-2], login1 ,", ["gpu1", "gpu2", "login1"]),
    ("", []),
])
def test_expand(expr, hosts):
    assert hostlist.expand(expr) == hosts


def test_expand_keeps_a_large_zero_padded_range_in_order():
    hosts = hostlist.expand("gpu[001-128]")
    assert len(hosts) == 128
    assert hosts[0] == "gpu001" and hosts[99] == "gpu100" and hosts[-1] == "gpu128"


@pytest.mark.parametrize("expr", [
    "gpu[1-",
    "gpu[1-3",
    "gpu1-3]",
    "gpu]1[",
    "gpu[a-c]",
    "gpu[3-1]",
    "gpu[]",
    "gpu[1,]",
    "gpu[-3]",
    "gpu[3-]",
    "gpu[1--3]",
    "gpu[1-3-5]",
    "gpu[[1-2]]",
    "gpu[x]",
])
def test_malformed_expressions_raise_value_error_naming_the_expression(expr):
    with pytest.raises(ValueError, match=r"gpu"):
        hostlist.expand(expr)
    with pytest.raises(ValueError):
        hostlist.validate(expr)


@pytest.mark.parametrize("expr", ["gpu[001-128]", "gpu*", "gpu-a?", "login*,gpu[1-2]", "n1", "rack[1-2]-gpu[01-04]"])
def test_validate_accepts_hostlists_and_globs(expr):
    hostlist.validate(expr)


@pytest.mark.parametrize("expr, host, expected", [
    ("gpu[001-128]", "gpu007", True),
    ("gpu[001-128]", "gpu128", True),
    ("gpu[001-128]", "gpu7", False),
    ("gpu[001-128]", "gpu129", False),
    ("gpu[001-128]", "gpu0070", False),
    ("gpu[1-3,10]", "gpu10", True),
    ("gpu[1-3,10]", "gpu4", False),
    ("rack[1-2]-gpu[01-04]", "rack2-gpu03", True),
    ("rack[1-2]-gpu[01-04]", "rack3-gpu03", False),
    ("gpu*", "gpu-a01", True),
    ("gpu*", "login1", False),
    ("gpu*", "xgpu1", False),
    ("gpu-a?", "gpu-a7", True),
    ("gpu-a?", "gpu-a17", False),
    ("login*,gpu[1-2]", "gpu2", True),
    ("login*,gpu[1-2]", "login03", True),
    ("login*,gpu[1-2]", "gpu3", False),
    ("n1", "n1", True),
    ("n1", "n10", False),
    ("GPU*", "gpu1", False),
])
def test_matches(expr, host, expected):
    assert hostlist.matches(expr, host) is expected


def test_matches_raises_on_a_malformed_expression():
    with pytest.raises(ValueError):
        hostlist.matches("gpu[1-", "gpu1")

"""A testbed of AMD nodes, or of both vendors: its settings and the gres.conf it writes (no cluster
started here; test_e2e_amd.py runs one)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_hooks.lab.testbed import LabSettings, Testbed, TestbedError


def gres_conf(tmp_path, **settings) -> list[str]:
    tb = Testbed(str(tmp_path), LabSettings(**settings))
    text = tb._text("gres.conf.j2", {"gres_groups": tb._gres_groups(), "shards": tb.settings.shards})
    return [line.replace(str(tmp_path), "S") for line in text.splitlines() if not line.startswith("#")]


def test_a_mixed_fleets_gres_conf_names_nvidia_devices_on_one_node_and_render_nodes_on_the_other(tmp_path):
    assert gres_conf(tmp_path, nodes=3, gpus=2, vendors={"n2": "amd"}) == [
        "NodeName=n1,n3 Name=gpu File=S/dev/nvidia0,S/dev/nvidia1",
        "NodeName=n2 Name=gpu File=S/dev/dri/renderD128,S/dev/dri/renderD129"]


def test_an_amd_fleet_in_another_gres_order_with_shards_names_render_nodes_in_that_order(tmp_path):
    assert gres_conf(tmp_path, nodes=2, gpus=2, vendor="amd", gres_order=(1, 0), shards=4) == [
        "NodeName=n1,n2 Name=gpu File=S/dev/dri/renderD129,S/dev/dri/renderD128",
        "NodeName=n1,n2 Name=shard Count=4 File=S/dev/dri/renderD129",
        "NodeName=n1,n2 Name=shard Count=4 File=S/dev/dri/renderD128"]


def test_each_nodes_vendor_survives_the_saved_settings_and_the_default_is_nvidia():
    settings = LabSettings(nodes=2, vendors={"n2": "amd"})
    saved = json.loads(json.dumps(dataclasses.asdict(settings)))
    assert LabSettings(**saved) == settings
    assert [settings.vendor_of(n) for n in settings.node_names] == ["nvidia", "amd"]
    assert [LabSettings().vendor_of(n) for n in ("n1", "n2")] == ["nvidia", "nvidia"]


@pytest.mark.parametrize("settings,says", [
    ({"vendor": "intel"}, "--vendor must be one of nvidia, amd, got 'intel'"),
    ({"vendors": {"n3": "amd"}}, "--vendor n3=amd: no node 'n3'"),
    ({"vendors": {"n2": "amd"}, "mig": 2}, "--mig is NVIDIA's"),
])
def test_settings_refuse_an_unknown_vendor_a_node_that_is_not_there_and_mig_on_amd(settings, says):
    with pytest.raises(TestbedError, match=says.replace("'", ".")):
        LabSettings(nodes=2, **settings)


def test_cli_vendor_option_sets_the_default_and_each_named_node():
    from slurm_hooks.commands.testbed import _vendors

    assert _vendors(("amd", "n1=nvidia")) == {"vendor": "amd", "vendors": {"n1": "nvidia"}}

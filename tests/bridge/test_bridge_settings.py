"""[bridge] settings: defaults, the shipped example, and errors that name file, line and key."""

from __future__ import annotations

import os
import textwrap

import pytest
from paths import ROOT

from slurm_hooks import config as config_mod
from slurm_hooks.bridge import settings as settings_mod
from slurm_hooks.bridge.settings import BridgeSection
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action

EXAMPLE = os.path.join(ROOT, "conf", "bridge.example.toml")


def load(tmp_path, text: str) -> BridgeSection:
    path = tmp_path / "config.toml"
    path.write_text(textwrap.dedent(text))
    return settings_mod.from_config(config_mod.load(str(path)))


def test_no_bridge_section_means_the_defaults(tmp_path):
    assert load(tmp_path, "") == BridgeSection()


def test_shipped_example_equals_the_defaults():
    assert settings_mod.from_config(config_mod.load(EXAMPLE)) == BridgeSection()


def test_defaults_are_safe():
    s = BridgeSection()
    assert s.trigger_actions == (Action.REBOOT, Action.REPLACE)
    assert 0 < s.breaker.max_percent < 100 and s.breaker.max_nodes >= 1 and s.breaker.window > 0
    assert s.replace.backend == "condition"


def test_the_management_cluster_and_the_held_alert_are_read_from_the_file(tmp_path):
    s = load(tmp_path, """
        [bridge]
        held_alert_after = 3600
        [bridge.capi]
        kubeconfig = "/etc/slurm-hooks/mgmt.kubeconfig"
        context = "mgmt"
        """)
    assert s.held_alert_after == 3600.0
    assert (s.capi.kubeconfig, s.capi.context) == ("/etc/slurm-hooks/mgmt.kubeconfig", "mgmt")


def test_a_typo_in_the_management_cluster_table_names_its_key(tmp_path):
    with pytest.raises(ConfigError, match="kubeconfg"):
        load(tmp_path, """
            [bridge.capi]
            kubeconfg = "/x"
            """)


def test_full_section_is_read(tmp_path):
    s = load(tmp_path, """
        [bridge]
        interval = 5
        trigger_actions = ["replace"]
        mapping = "name"
        [bridge.breaker]
        max_percent = 5
        max_nodes = 2
        [bridge.replace]
        backend = "karpenter"
        [bridge.nodes]
        gpu001 = "ip-10-0-0-1"
    """)
    assert s.interval == 5 and s.trigger_actions == (Action.REPLACE,) and s.mapping == "name"
    assert s.breaker.max_nodes == 2 and s.breaker.max_percent == 5
    assert s.replace.backend == "karpenter" and s.nodes == {"gpu001": "ip-10-0-0-1"}


@pytest.mark.parametrize("text, line, key, words", [
    ("[bridge]\nintervall = 3\n", 2, "[bridge] intervall", "unknown key"),
    ("[bridge]\ninterval = \"soon\"\n", 2, "[bridge] interval", "expected a number"),
    ("[bridge]\ninterval = 0\n", 2, "[bridge] interval", "greater than 0"),
    ("[bridge]\ntrigger_actions = [\"explode\"]\n", 2, "[bridge] trigger_actions", "unknown action 'explode'"),
    ("[bridge]\ntrigger_actions = []\n", 2, "[bridge] trigger_actions", "at least one"),
    ("[bridge]\nmapping = \"dns\"\n", 2, "[bridge] mapping", "must be one of auto, slinky, name"),
    ("[bridge]\ndrain = \"yes\"\n", 2, "[bridge] drain", "expected true or false"),
    ("[bridge]\n\n[bridge.breaker]\nmax_percent = 0\n", 4, "[bridge.breaker] max_percent", "(0, 100]"),
    ("[bridge.breaker]\nmax_percent = 150\n", 2, "[bridge.breaker] max_percent", "(0, 100]"),
    ("[bridge.breaker]\nmax_nodes = 0\n", 2, "[bridge.breaker] max_nodes", "cannot be switched off"),
    ("[bridge.breaker]\nwindow = -1\n", 2, "[bridge.breaker] window", "must not be negative"),
    ("[bridge.replace]\nbackend = \"terraform\"\n", 2, "[bridge.replace] backend", "must be one of"),
    ("[bridge.replace]\nbackend = \"template\"\n", 1, "[bridge.replace] template", "needs a template path"),
    ("[bridge.nodes]\ngpu001 = 7\n", 2, "[bridge.nodes] gpu001", "expected a Kubernetes node name"),
    ("[bridge]\nbreaker = 3\n", 2, "[bridge.breaker]", "must be a table"),
])
def test_bad_settings_name_file_line_and_key(tmp_path, text, line, key, words):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert err.value.path == str(tmp_path / "config.toml")
    assert err.value.line == line
    assert err.value.key == key
    assert words in str(err.value)


def test_template_backend_checks_the_template_parses(tmp_path):
    tpl = tmp_path / "cr.j2"
    tpl.write_text("metadata:\n  name: {{ node }\n")
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"""
            [bridge.replace]
            backend = "template"
            template = "{tpl}"
            plural = "fixes"
        """)
    assert err.value.key == "[bridge.replace] template" and "cr.j2:2" in str(err.value)


def test_template_backend_missing_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, """
            [bridge.replace]
            backend = "template"
            template = "/nonexistent/cr.j2"
            plural = "fixes"
        """)
    assert "cannot read /nonexistent/cr.j2" in str(err.value)

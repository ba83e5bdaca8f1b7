"""Configuration: defaults, the shipped file, node groups, and where every mistake is."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slurm_hooks import config
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Expectations

SHIPPED = Path(__file__).resolve().parent.parent / "slurm_hooks" / "templates" / "install" / "config.toml"


def write(tmp_path: Path, text: str, name: str = "config.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        config.load(path)
    message = str(exc.value)
    assert "\n" not in message
    return message.replace(path, "FILE")


# --- defaults ------------------------------------------------------------------


def _defaults(section: str) -> dict:
    """A section's keys -> their defaults, as its class declares them."""
    return {key: default for key, (_, default, _, _) in config.spec(config.SECTIONS[section]).items()}


def test_empty_config_gives_every_schema_default():
    cfg = config.parse("")
    for section, cls in config.SECTIONS.items():
        assert getattr(cfg, section) == cls(), section
        assert vars(getattr(cfg, section)) == _defaults(section), section
    assert cfg.expect == Expectations()
    assert cfg.groups == ()
    assert cfg.expectations_for("gpu001") == Expectations()
    assert cfg.group_for("gpu001") == "default"


def test_some_defaults_an_admin_relies_on():
    cfg = config.parse("")
    assert cfg.gpu.backend == "nvml"
    assert cfg.check.drain is True
    assert cfg.check.on_check_error == "drain"
    assert cfg.check.deadline < 60  # slurmd kills HealthCheckProgram at 60 s
    assert cfg.expect.gpus is None


def test_every_value_is_kept_as_its_field_declares():
    cfg = config.parse('[gpu]\nprobe_timeout = 5\n[check]\ndeadline = 30\n[repair]\nservices = ["a"]\n')
    assert type(cfg.gpu.probe_timeout) is float and type(cfg.check.deadline) is float
    assert cfg.repair.services == ("a",)
    for section, cls in config.SECTIONS.items():
        for key, (_, _, _, make) in config.spec(cls).items():
            if make is float:
                assert type(getattr(getattr(cfg, section), key)) is float, (section, key)


def test_a_float_key_takes_any_number_but_not_true():
    assert config.parse("[notify]\nrate = 2\n").notify.rate == 2.0
    with pytest.raises(ConfigError, match="expected a number, got bool True"):
        config.parse("[notify]\nrate = true\n")


def test_unknown_section_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        config.parse("").nonexistent  # noqa: B018


def test_values_given_replace_the_defaults_and_the_rest_stay():
    cfg = config.parse('[gpu]\nbackend = "sim"\nprobe_timeout = 5\n[expect]\ngpus = 8\nmodel = "H100"\n')
    assert (cfg.gpu.backend, cfg.gpu.probe_timeout, cfg.gpu.sim_dir) == ("sim", 5, "/var/lib/slurm-hooks/sim")
    assert cfg.expect == Expectations(gpus=8, model="H100")


def test_open_sections_are_kept_raw_for_their_owner():
    cfg = config.parse('[bridge]\nkubeconfig = "/etc/k"\nmax_unhealthy = 3\n')
    assert (cfg.raw["bridge"]["kubeconfig"], cfg.raw["bridge"]["max_unhealthy"]) == ("/etc/k", 3)


# --- the shipped file -------------------------------------------------------------


def test_shipped_config_equals_the_schema_defaults():
    assert SHIPPED.exists(), "the example config (package data) is missing"
    cfg = config.load(str(SHIPPED))
    for section, cls in config.SECTIONS.items():
        assert getattr(cfg, section) == cls(), section
    assert cfg.expect == Expectations()
    assert cfg.groups == ()


def test_shipped_config_mentions_every_key():
    text = SHIPPED.read_text()
    for section, cls in config.SECTIONS.items():
        assert re.search(rf"^\[{section}\]", text, re.M), section
        for key in config.spec(cls):
            assert re.search(rf"^#?\s*{key}\s*=", text, re.M), f"[{section}] {key} is not in the example config"


# --- groups ------------------------------------------------------------------------

GROUPS = """\
[expect]
gpus = 8
temp_fail_c = 90

[groups.h100]
nodes = "gpu[001-128]"
model = "H100"
nvlinks = 18
fabric_manager = true

[groups.l40s]
nodes = "inf-*,gpu[200-210]"
model = "L40S"
gpus = 4
persistence_mode = false

[groups.catchall]
nodes = "gpu*"
gpus = 2
"""


def test_group_by_hostlist_overrides_and_inherits_from_expect():
    cfg = config.parse(GROUPS)
    assert cfg.group_for("gpu007") == "h100"
    assert cfg.expectations_for("gpu007") == Expectations(gpus=8, temp_fail_c=90, model="H100", nvlinks=18,
                                                          fabric_manager=True)


def test_group_by_glob_and_by_a_second_hostlist_part():
    cfg = config.parse(GROUPS)
    for node in ("inf-a01", "gpu205"):
        assert cfg.group_for(node) == "l40s"
        assert cfg.expectations_for(node) == Expectations(gpus=4, temp_fail_c=90, model="L40S", persistence_mode=False)


def test_first_matching_group_in_file_order_wins():
    cfg = config.parse(GROUPS)
    assert cfg.group_for("gpu128") == "h100"  # also matches "gpu*" further down
    assert cfg.group_for("gpu129") == "catchall"
    assert cfg.expectations_for("gpu129").gpus == 2
    reordered = config.parse(GROUPS.replace("[groups.catchall]", "[groups.aaa]").replace(
        '[groups.h100]', '[groups.catchall]\nnodes = "gpu*"\ngpus = 2\n\n[groups.h100]', 1))
    assert [g.name for g in reordered.groups][:2] == ["catchall", "h100"]
    assert reordered.group_for("gpu007") == "catchall"


def test_a_node_in_no_group_gets_the_expect_section():
    cfg = config.parse(GROUPS)
    assert cfg.group_for("login1") == "default"
    assert cfg.expectations_for("login1") == Expectations(gpus=8, temp_fail_c=90)


# --- every error kind says file:line: [section] key: message --------------------------


def test_bad_toml_names_its_line(tmp_path):
    msg = error_of(tmp_path, '[gpu]\nbackend = "sim"\nsim_dir = \n')
    assert msg.startswith("FILE:3: ")
    assert "Invalid value" in msg


def test_unknown_section_names_its_line(tmp_path):
    msg = error_of(tmp_path, '[gpu]\nbackend = "sim"\n\n[gpuu]\nx = 1\n')
    assert msg.startswith("FILE:4: [gpuu]: unknown section (known: ")
    assert "expect" in msg and "groups" in msg


def test_unknown_key_names_its_line_and_the_known_keys(tmp_path):
    msg = error_of(tmp_path, '[check]\ndrain = true\ndeadlin = 30\n')
    assert msg == "FILE:3: [check] deadlin: unknown key (known: deadline, drain, drain_guard, on_check_error)"


@pytest.mark.parametrize("text, line, key, message", [
    ('[check]\ndeadline = "45"\n', 2, "[check] deadline", "expected a number, got str '45'"),
    ('[check]\ndeadline = true\n', 2, "[check] deadline", "expected a number, got bool True"),
    ('[check]\ndrain = 1\n', 2, "[check] drain", "expected true or false, got int 1"),
    ('[expect]\ngpus = 8.0\n', 2, "[expect] gpus", "expected an integer, got float 8.0"),
    ('[expect]\ngpus = true\n', 2, "[expect] gpus", "expected an integer, got bool True"),
    ('[expect]\nmodel = 100\n', 2, "[expect] model", "expected a string, got int 100"),
    ('[expect]\npersistence_mode = "on"\n', 2, "[expect] persistence_mode", "expected true or false, got str 'on'"),
    ('[log]\naudit = ["a", "b"]\n', 2, "[log] audit", "expected a string, got list ['a', 'b']"),
])
def test_wrong_type_names_line_key_and_what_was_expected(tmp_path, text, line, key, message):
    assert error_of(tmp_path, text) == f"FILE:{line}: {key}: {message}"


@pytest.mark.parametrize("text, line, key, message", [
    ('[gpu]\nbackend = "cuda"\n', 2, "[gpu] backend", "must be one of nvml, amdsmi, auto, sim, not 'cuda'"),
    ('[check]\non_check_error = "ignore"\n', 2, "[check] on_check_error", "must be one of drain, warn, not 'ignore'"),
    ('[slurm]\nbackend = "rest"\n', 2, "[slurm] backend", "must be one of auto, scontrol, pyslurm, not 'rest'"),
])
def test_bad_enum_value_lists_the_allowed_ones(tmp_path, text, line, key, message):
    assert error_of(tmp_path, text) == f"FILE:{line}: {key}: {message}"


@pytest.mark.parametrize("text, line, key, message", [
    ('[gpu]\nprobe_timeout = -1\n', 2, "[gpu] probe_timeout", "must not be negative, got -1"),
    ('[expect]\ntemp_fail_c = -5\n', 2, "[expect] temp_fail_c", "must not be negative, got -5"),
    ('[groups.a]\nnodes = "n1"\nxid_repeat_count = -3\n', 3, "[groups.a] xid_repeat_count",
     "must not be negative, got -3"),
])
def test_negative_number_is_refused(tmp_path, text, line, key, message):
    assert error_of(tmp_path, text) == f"FILE:{line}: {key}: {message}"


@pytest.mark.parametrize("text, line, key, message", [
    ('[check]\ndeadline = 0\n', 2, "[check] deadline",
     "must be > 0 and < 60 (slurmd kills the health check at 60 s), got 0"),
    ('[check]\ndrain = true\ndeadline = 60\n', 3, "[check] deadline",
     "must be > 0 and < 60 (slurmd kills the health check at 60 s), got 60"),
    ('[check]\ndeadline = 0.0\n', 2, "[check] deadline",
     "must be > 0 and < 60 (slurmd kills the health check at 60 s), got 0.0"),
    ('[gpu]\nprobe_timeout = 0\n', 2, "[gpu] probe_timeout", "must be > 0, got 0"),
    ('[slurm]\ntimeout = 0\n', 2, "[slurm] timeout", "must be > 0, got 0"),
    ('[dcgm]\ntimeout = 0\n', 2, "[dcgm] timeout", "must be > 0, got 0"),
    ('[watch]\npoll_interval = 0\n', 2, "[watch] poll_interval", "must be > 0, got 0"),
    ('[expect]\ntemp_fail_c = 0\n', 2, "[expect] temp_fail_c", "must be >= 1 and <= 150 (degrees C, as NVML reports them), got 0"),
    ('[expect]\ntemp_warn_c = 400\n', 2, "[expect] temp_warn_c", "must be >= 1 and <= 150 (degrees C, as NVML reports them), got 400"),
    ('[expect]\npcie_gen = 0\n', 2, "[expect] pcie_gen", "must be >= 1 and <= 10, got 0"),
    ('[expect]\npcie_width = 0\n', 2, "[expect] pcie_width", "must be >= 1 and <= 32, got 0"),
    ('[expect]\nnvlinks = 99\n', 2, "[expect] nvlinks", "must be >= 0 and <= 36 (NVML knows at most 36 links per GPU), got 99"),
    ('[expect]\nxid_repeat_window_s = 0\n', 2, "[expect] xid_repeat_window_s", "must be > 0, got 0"),
    ('[expect]\ndcgm_level_check = 9\n', 2, "[expect] dcgm_level_check",
     "must be >= 0 and <= 4 (0 = off, 1..4 = dcgmi diag -r level), got 9"),
    ('[groups.a]\nnodes = "n1"\npcie_gen = 0\n', 3, "[groups.a] pcie_gen", "must be >= 1 and <= 10, got 0"),
])
def test_a_number_that_cannot_work_is_refused_naming_file_line_and_key(tmp_path, text, line, key, message):
    assert error_of(tmp_path, text) == f"FILE:{line}: {key}: {message}"


@pytest.mark.parametrize("text, line, key", [
    ('[gpu]\nprobe_timeout = 45\n', 2, "[gpu] probe_timeout"),  # against the default deadline
    ('[check]\ndeadline = 15\n', 2, "[check] deadline"),  # against the default probe_timeout = 20
    ('[gpu]\nprobe_timeout = 30\n[check]\ndeadline = 30\n', 2, "[gpu] probe_timeout"),
    ('[gpu]\nprobe_timeout = 5\n[check]\ndeadline = 20\n[slurm]\ntimeout = 25\n', 6, "[slurm] timeout"),
])
def test_a_wait_longer_than_the_deadline_is_refused(tmp_path, text, line, key):
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"FILE:{line}: {key}: ") and "must be shorter than [check] deadline" in msg


def test_warning_temperature_above_the_failing_one_is_refused(tmp_path):
    assert error_of(tmp_path, '[expect]\ntemp_warn_c = 99\n') == \
        "FILE:2: [expect] temp_warn_c: temp_warn_c = 99 is above temp_fail_c = 95: the warning must come first"
    assert error_of(tmp_path, '[expect]\ntemp_fail_c = 80\n') == \
        "FILE:2: [expect] temp_fail_c: temp_warn_c = 85 is above temp_fail_c = 80: the warning must come first"
    assert error_of(tmp_path, '[expect]\ntemp_fail_c = 90\n[groups.a]\nnodes = "n1"\ntemp_warn_c = 92\n').startswith(
        "FILE:5: [groups.a] temp_warn_c: temp_warn_c = 92 is above temp_fail_c = 90")


def test_values_at_the_edge_of_what_works_are_accepted():
    cfg = config.parse('[gpu]\nprobe_timeout = 0.5\n[check]\ndeadline = 59.9\n[slurm]\ntimeout = 1\n'
                       '[expect]\ngpus = 0\nnvlinks = 0\nxid_repeat_count = 0\ntemp_warn_c = 90\ntemp_fail_c = 90\n')
    assert (cfg.check.deadline, cfg.expect.gpus, cfg.expect.temp_warn_c) == (59.9, 0, 90)


def test_nan_is_not_a_number_of_seconds(tmp_path):
    msg = error_of(tmp_path, '[gpu]\nprobe_timeout = nan\n')
    assert msg.startswith("FILE:2: [gpu] probe_timeout: ")


def test_an_error_in_a_key_that_exists_in_two_sections_points_at_the_right_one(tmp_path):
    msg = error_of(tmp_path, '[slurm]\ntimeout = 10\n\n[dcgm]\ntimeout = -5\n')
    assert msg == "FILE:5: [dcgm] timeout: must not be negative, got -5"


def test_dotted_keys_at_top_level_are_located(tmp_path):
    msg = error_of(tmp_path, '# comment\ngpu.backend = "cuda"\n')
    assert msg == "FILE:2: [gpu] backend: must be one of nvml, amdsmi, auto, sim, not 'cuda'"


def test_a_section_that_is_not_a_table_is_located(tmp_path):
    assert error_of(tmp_path, 'check = 5\n') == "FILE:1: [check]: must be a table"


def test_bad_hostlist_in_a_group_names_the_nodes_line(tmp_path):
    msg = error_of(tmp_path, '[groups.h100]\ngpus = 8\nnodes = "gpu[001-128"\n')
    assert msg.startswith("FILE:3: [groups.h100] nodes: unbalanced '[' in 'gpu[001-128'")


def test_reversed_range_in_a_group_is_refused(tmp_path):
    msg = error_of(tmp_path, '[groups.h100]\nnodes = "gpu[128-001]"\n')
    assert msg.startswith("FILE:2: [groups.h100] nodes: bad range '128-001'")


def test_group_without_nodes_names_the_group_header(tmp_path):
    msg = error_of(tmp_path, '[expect]\ngpus = 8\n\n[groups.h100]\ngpus = 8\n')
    assert msg == "FILE:4: [groups.h100]: needs a 'nodes' hostlist (e.g. \"gpu[001-128]\")"


def test_group_with_empty_nodes_is_refused(tmp_path):
    msg = error_of(tmp_path, '[groups.h100]\nnodes = ""\ngpus = 8\n')
    assert msg.startswith("FILE:2: [groups.h100] nodes: ")


def test_unknown_key_in_a_group_names_its_line(tmp_path):
    msg = error_of(tmp_path, '[groups.h100]\nnodes = "gpu[1-4]"\nmodle = "H100"\n')
    assert msg.startswith("FILE:3: [groups.h100] modle: unknown key (known: ")


def test_quoted_group_name_is_located(tmp_path):
    msg = error_of(tmp_path, '[groups."h100-a"]\nnodes = "gpu[1-4]"\ngpus = -1\n')
    assert msg == "FILE:3: [groups.h100-a] gpus: must not be negative, got -1"


def test_a_group_that_is_not_a_table_is_located(tmp_path):
    msg = error_of(tmp_path, '[groups]\nh100 = "gpu[001-128]"\n')
    assert msg == "FILE:2: [groups.h100]: must be a table"


def test_non_utf8_file_is_a_config_error(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b'[gpu]\nbackend = "\xff"\n')
    with pytest.raises(ConfigError, match=r"config\.toml: not UTF-8 \(byte 17\)"):
        config.load(str(path))


def test_parse_without_a_path_says_string():
    with pytest.raises(ConfigError, match=r"^<string>:2: \[gpu\] backend: "):
        config.parse('[gpu]\nbackend = "x"\n')


# --- which file ------------------------------------------------------------------------


def test_explicit_path_wins_over_the_env_var(tmp_path, monkeypatch):
    env = write(tmp_path, '[gpu]\nbackend = "sim"\nsim_dir = "/from/env"\n', "env.toml")
    explicit = write(tmp_path, '[gpu]\nbackend = "sim"\nsim_dir = "/from/flag"\n', "flag.toml")
    monkeypatch.setenv(config.ENV_VAR, env)
    cfg = config.load(explicit)
    assert (cfg.path, cfg.gpu.sim_dir) == (explicit, "/from/flag")


def test_env_var_is_used_without_an_explicit_path(tmp_path, monkeypatch):
    env = write(tmp_path, '[gpu]\nsim_dir = "/from/env"\n', "env.toml")
    monkeypatch.setenv(config.ENV_VAR, env)
    cfg = config.load()
    assert (cfg.path, cfg.gpu.sim_dir) == (env, "/from/env")


def test_missing_explicit_file_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as exc:
        config.load(missing)
    assert str(exc.value) == f"{missing}: file not found"


def test_missing_file_named_by_the_env_var_is_a_config_error(tmp_path, monkeypatch):
    missing = str(tmp_path / "nope.toml")
    monkeypatch.setenv(config.ENV_VAR, missing)
    with pytest.raises(ConfigError, match="file not found"):
        config.load()


def test_missing_default_file_gives_the_defaults(monkeypatch):
    if os.path.exists(config.DEFAULT_PATH):
        pytest.skip(f"{config.DEFAULT_PATH} exists on this machine")
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    cfg = config.load()
    assert cfg.path is None
    assert cfg.expect == Expectations()
    assert cfg.gpu.backend == "nvml"


def test_resolve_path_order(monkeypatch):
    monkeypatch.setenv(config.ENV_VAR, "/env.toml")
    assert config.resolve_path("/flag.toml") == ("/flag.toml", True)
    assert config.resolve_path() == ("/env.toml", True)
    monkeypatch.setenv(config.ENV_VAR, "")
    assert config.resolve_path() == (config.DEFAULT_PATH, False)


def test_unreadable_file_is_a_config_error(tmp_path):
    directory = tmp_path / "config.toml"
    directory.mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(str(directory))

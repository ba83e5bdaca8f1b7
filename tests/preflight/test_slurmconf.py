"""slurm.conf parsing: includes, case, comments, continuations, node lines, durations."""

from __future__ import annotations

import math
import os

import pytest
from paths import FIXTURES as TEST_FIXTURES

from slurm_hooks.preflight import slurmconf
from slurm_hooks.preflight.slurmconf import SlurmConfError

FIXTURES = os.path.join(TEST_FIXTURES, "slurmconf")
MAIN = os.path.join(FIXTURES, "slurm.conf")


@pytest.fixture(scope="module")
def conf():
    return slurmconf.load(MAIN)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_keys_are_case_insensitive_and_remember_file_and_line(conf):
    e = conf.entry("prologepilogtimeout")
    assert (e.key, e.value, e.path, e.line) == ("PrologEpilogTimeout", "120", MAIN, 16)
    assert conf.get("PROLOGEPILOGTIMEOUT") == "120"
    assert conf.where("PrologEpilogTimeout") == f"{MAIN}:16"
    assert str(e) == "PrologEpilogTimeout=120"


def test_included_files_are_relative_to_the_including_file_and_globs_sorted(conf):
    assert conf.files == (
        MAIN,
        os.path.join(FIXTURES, "nodes.conf"),
        os.path.join(FIXTURES, "conf.d", "10-jobs.conf"),
        os.path.join(FIXTURES, "conf.d", "20-health.conf"),
    )
    assert conf.entry("HealthCheckInterval").where == os.path.join(FIXTURES, "conf.d", "20-health.conf") + ":2"


def test_a_key_given_twice_keeps_the_later_value_like_slurmctld(conf):
    kill = conf.entry("KillWait")
    assert kill.value == "90"
    assert kill.where == os.path.join(FIXTURES, "conf.d", "10-jobs.conf") + ":4"
    assert conf.get("MessageTimeout") == "20"


def test_comments_are_stripped_but_escaped_hash_kept(tmp_path):
    path = write(tmp_path / "slurm.conf", 'A=1 # note\n# B=2\nC=x\\#y\nD="q # r"\n')
    conf = slurmconf.load(path)
    assert conf.get("a") == "1"
    assert "b" not in conf
    assert conf.get("c") == "x#y"
    assert conf.get("d") == "q # r"


def test_continuation_lines_join_and_report_their_first_line(conf):
    e = conf.entry("SchedulerParameters")
    assert e.value == "bf_interval=30,nohold_on_prolog_fail,max_rpc_cnt=150"
    assert e.line == 22


def test_scheduler_parameters_become_a_dict_of_flags_and_values(conf):
    assert conf.scheduler_parameters() == {"bf_interval": "30", "nohold_on_prolog_fail": None, "max_rpc_cnt": "150"}
    assert slurmconf.parse_parameters("Nohold_On_Prolog_Fail, bf_window=60 ,") == {
        "nohold_on_prolog_fail": None, "bf_window": "60"}


def test_node_lines_inherit_nodename_default_and_keep_their_line(conf):
    n1, n2, cpu = conf.nodes
    assert (n1.name, n1.get("gres"), n1.get("port"), n1.gpus) == ("n1", "gpu:8", "17001", 8)
    assert n1.where == os.path.join(FIXTURES, "nodes.conf") + ":3"
    assert n2.gpus == 8 and n2.get("Features") == "nvlink,h100"
    assert n2.line == 4
    assert cpu.gpus == 0
    assert [r.name for r in conf.nodes_named("cpu03")] == ["cpu[01-04]"]
    assert conf.nodes_named("gpu99") == []
    assert [p.name for p in conf.partitions] == ["gpu"]


def test_list_settings_split_on_commas(conf):
    assert conf.list("HealthCheckNodeState") == ["ANY", "CYCLE"]
    assert conf.list("GresTypes") == ["gpu"]
    assert conf.list("NotSet") == []


@pytest.mark.parametrize("text,seconds", [
    ("30", 30), ("0", 0), ("1:30", 90), ("1:00:00", 3600), ("2-0", 172800),
    ("1-02:03", 93780), ("1-02:03:04", 93784), ("INFINITE", math.inf), ("unlimited", math.inf),
])
def test_durations_in_seconds(text, seconds):
    assert slurmconf.parse_duration(text) == seconds


def test_a_plain_number_can_count_minutes_like_a_time_limit():
    assert slurmconf.parse_duration("90", unit=60) == 5400


@pytest.mark.parametrize("text", ["", "30s", "1:2:3:4", "a-1", "-5", "1.5"])
def test_bad_durations_are_rejected(text):
    with pytest.raises(ValueError):
        slurmconf.parse_duration(text)


def test_a_bad_duration_setting_names_file_line_and_key(tmp_path):
    path = write(tmp_path / "slurm.conf", "ClusterName=x\nKillWait=thirty\n")
    with pytest.raises(SlurmConfError) as exc:
        slurmconf.load(path).seconds("KillWait")
    assert str(exc.value).startswith(f"{path}:2: KillWait: not a duration")


def test_a_line_that_is_not_key_value_names_file_and_line(tmp_path):
    path = write(tmp_path / "slurm.conf", "ClusterName=x\nNodeName=n1 garbage\n")
    with pytest.raises(SlurmConfError) as exc:
        slurmconf.load(path)
    assert str(exc.value).startswith(f"{path}:2: cannot parse 'garbage'")


def test_a_missing_include_names_the_include_line(tmp_path):
    path = write(tmp_path / "slurm.conf", "ClusterName=x\n\nInclude gres-nodes.conf\n")
    with pytest.raises(SlurmConfError) as exc:
        slurmconf.load(path)
    assert f"{path}:3: Include gres-nodes.conf: file not found: {tmp_path}/gres-nodes.conf" == str(exc.value)


def test_a_glob_include_matching_nothing_is_fine(tmp_path):
    path = write(tmp_path / "slurm.conf", "ClusterName=x\ninclude conf.d/*.conf\n")
    assert slurmconf.load(path).get("ClusterName") == "x"


def test_an_include_loop_is_an_error_not_a_hang(tmp_path):
    path = write(tmp_path / "slurm.conf", "Include slurm.conf\n")
    with pytest.raises(SlurmConfError, match="nested deeper"):
        slurmconf.load(path)


def test_absolute_include_and_nested_include_relative_to_its_own_directory(tmp_path):
    write(tmp_path / "etc" / "sub" / "b.conf", "KillWait=45\n")
    inner = write(tmp_path / "etc" / "sub" / "a.conf", "Include b.conf\n")
    path = write(tmp_path / "elsewhere" / "slurm.conf", f"Include {inner}\n")
    conf = slurmconf.load(path)
    assert conf.seconds("KillWait") == 45
    assert conf.entry("KillWait").path == str(tmp_path / "etc" / "sub" / "b.conf")


def test_slurm_conf_env_is_used_when_no_path_is_given(tmp_path, monkeypatch):
    path = write(tmp_path / "env.conf", "ClusterName=from-env\n")
    monkeypatch.setenv("SLURM_CONF", path)
    assert slurmconf.load().get("ClusterName") == "from-env"
    other = write(tmp_path / "explicit.conf", "ClusterName=explicit\n")
    assert slurmconf.load(other).get("ClusterName") == "explicit"


def test_a_missing_file_is_a_config_error_naming_it(tmp_path):
    missing = str(tmp_path / "nope.conf")
    with pytest.raises(SlurmConfError, match="nope.conf: file not found"):
        slurmconf.load(missing)


def test_program_paths_resolve_relative_to_slurm_conf(conf):
    assert conf.resolve("prolog.sh") == os.path.join(FIXTURES, "prolog.sh")
    assert conf.resolve("/usr/bin/x") == "/usr/bin/x"

"""Textfile metrics: valid Prometheus exposition, contexts kept apart, counters persisted."""

from __future__ import annotations

import json
import os
import re

import pytest

from slurm_hooks.models import Action, Context, Finding, GpuSnapshot, NodeSnapshot, Report, Severity
from slurm_hooks.observe import metrics

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_exposition(text):
    """A strict reader of the text format 0.0.4: families -> {type, help, samples}.

    Fails on anything a Prometheus scrape would reject or warn about: an unknown
    escape, a sample before its TYPE, a family split in two, a duplicate series.
    """
    assert text.endswith("\n"), "must end with a newline"
    families, order, seen = {}, [], set()
    current = None
    for no, line in enumerate(text[:-1].split("\n"), 1):
        assert line, f"line {no}: empty line"
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert _NAME.fullmatch(name), f"line {no}: bad metric name {name!r}"
                fam = families.setdefault(name, {"type": None, "help": None, "samples": []})
                if name not in order:
                    order.append(name)
                assert not fam["samples"], f"line {no}: {parts[1]} after samples of {name}"
                key = parts[1].lower()
                assert fam[key] is None, f"line {no}: second {parts[1]} for {name}"
                value = parts[3] if len(parts) > 3 else ""
                if key == "type":
                    assert value in _TYPES, f"line {no}: bad type {value!r}"
                else:
                    assert not re.search(r"\\[^\\n]", value), f"line {no}: bad escape in HELP"
                fam[key] = value
                current = name
            continue
        m = _NAME.match(line)
        assert m, f"line {no}: bad sample {line!r}"
        name, rest = m.group(0), line[m.end():]
        labels = {}
        if rest.startswith("{"):
            pos = 1
            while rest[pos] != "}":
                lm = _LABEL.match(rest, pos)
                assert lm, f"line {no}: bad label at {rest[pos:]!r}"
                assert lm.group(1) not in labels, f"line {no}: label {lm.group(1)} twice"
                labels[lm.group(1)] = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)), lm.group(2))
                pos = lm.end()
                if rest[pos] == ",":
                    pos += 1
            rest = rest[pos + 1:]
        assert rest.startswith(" "), f"line {no}: no space before value"
        fields = rest.split()
        assert 1 <= len(fields) <= 2, f"line {no}: trailing garbage"
        value = float(fields[0].replace("Inf", "inf"))
        suffixes = ("_sum", "_count") if current and families[current]["type"] == "summary" else ()
        if name != current and any(name == f"{current}{s}" for s in suffixes):
            labels = {**labels, "__name__": name}  # a summary's _sum and _count belong to its family
            name = current
        assert name == current, f"line {no}: sample {name} outside its family {current}"
        assert families[name]["type"] is not None, f"line {no}: sample before TYPE"
        series = (name, tuple(sorted(labels.items())))
        assert series not in seen, f"line {no}: duplicate series {series}"
        seen.add(series)
        families[name]["samples"].append((labels, value))
    return families


@pytest.mark.parametrize("text", [
    'm{a="1"} 1\n',                                                    # no TYPE
    '# TYPE m gauge\nm{a="1"} 1\nm{a="1"} 2\n',                      # duplicate series
    '# TYPE m gauge\nm{a="\\x"} 1\n',                               # unknown escape
    '# TYPE m gauge\nm 1\n# TYPE n gauge\nn 1\nm{a="2"} 1\n',       # family split in two
    '# TYPE m gauge\nm 1',                                             # no final newline
])
def test_the_strict_reader_rejects_what_a_scrape_would(text):
    with pytest.raises((AssertionError, ValueError)):
        parse_exposition(text)


def snapshot(node="n1", gpus=4, lost=()):
    return NodeSnapshot(node, "sim", gpus=tuple(GpuSnapshot(i, lost=i in lost) for i in range(gpus)))


def report(context=Context.CHECK, findings=(), node="n1", duration=0.25, gpus=4, lost=()):
    return Report(node, context, tuple(findings), duration, snapshot(node, gpus, lost))


XID79 = Finding("xid", Severity.FAIL, Action.REPLACE, "XID 79: GPU fallen off the bus", gpu=2, summary="XID 79 on GPU 2")
HOT = Finding("thermal", Severity.WARN, Action.WARN, "GPU 1 at 88 C", gpu=1)


@pytest.fixture
def dirs(tmp_path):
    return str(tmp_path / "textfile"), str(tmp_path / "state")


def read(path):
    with open(path) as fh:
        return parse_exposition(fh.read())


def value(families, name, **labels):
    matches = [v for lab, v in families[name]["samples"] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(matches) == 1, (name, labels, families[name]["samples"])
    return matches[0]


def test_unhealthy_check_is_written_as_valid_exposition(dirs):
    textfile, state = dirs
    path = metrics.write(textfile, "n1", report(findings=[XID79, HOT]), state_dir=state,
                         remediations=["drain", "requeue"], now=1700000000.5)
    assert path == os.path.join(textfile, "slurm_hooks.prom")
    fam = read(path)
    assert {name: f["type"] for name, f in fam.items()} == {
        "slurm_hooks_check_status": "gauge",
        "slurm_hooks_findings": "gauge",
        "slurm_hooks_gpu_healthy": "gauge",
        "slurm_hooks_last_run_timestamp_seconds": "gauge",
        "slurm_hooks_last_run_duration_seconds": "gauge",
        "slurm_hooks_remediations_total": "counter",
        "slurm_hooks_pending_actions": "gauge",
        "slurm_hooks_requeue_seconds": "summary",
    }
    assert all(f["help"] for f in fam.values())
    assert value(fam, "slurm_hooks_check_status", node="n1", context="check") == 0
    assert value(fam, "slurm_hooks_findings", check="xid", severity="fail") == 1
    assert value(fam, "slurm_hooks_findings", check="thermal", severity="warn") == 1
    assert [value(fam, "slurm_hooks_gpu_healthy", gpu=str(i)) for i in range(4)] == [1, 1, 0, 1]
    assert value(fam, "slurm_hooks_last_run_timestamp_seconds", context="check") == 1700000000.5
    assert value(fam, "slurm_hooks_last_run_duration_seconds", context="check") == 0.25
    assert value(fam, "slurm_hooks_remediations_total", node="n1", action="drain") == 1


def test_healthy_run_reports_status_one_and_no_findings(dirs):
    textfile, state = dirs
    fam = read(metrics.write(textfile, "n1", report(), state_dir=state))
    assert value(fam, "slurm_hooks_check_status", context="check") == 1
    assert fam["slurm_hooks_findings"]["samples"] == []
    assert {v for _, v in fam["slurm_hooks_gpu_healthy"]["samples"]} == {1}


def test_lost_gpu_is_unhealthy_even_without_a_gpu_finding(dirs):
    textfile, state = dirs
    fam = read(metrics.write(textfile, "n1", report(lost={3}), state_dir=state))
    assert value(fam, "slurm_hooks_gpu_healthy", gpu="3") == 0


def test_each_context_keeps_its_series_when_another_runs(dirs):
    textfile, state = dirs
    metrics.write(textfile, "n1", report(Context.CHECK, [XID79]), state_dir=state, now=100.0)
    metrics.write(textfile, "n1", report(Context.PROLOG), state_dir=state, now=200.0)
    metrics.write(textfile, "n1", report(Context.EPILOG, [HOT]), state_dir=state, now=300.0)
    fam = read(metrics.write(textfile, "n1", report(Context.WATCH), state_dir=state, now=400.0))
    status = {lab["context"]: v for lab, v in fam["slurm_hooks_check_status"]["samples"]}
    assert status == {"check": 0, "prolog": 1, "epilog": 1, "watch": 1}
    assert value(fam, "slurm_hooks_findings", context="check", check="xid") == 1
    assert value(fam, "slurm_hooks_findings", context="epilog", check="thermal") == 1
    stamps = {lab["context"]: v for lab, v in fam["slurm_hooks_last_run_timestamp_seconds"]["samples"]}
    assert stamps == {"check": 100.0, "prolog": 200.0, "epilog": 300.0, "watch": 400.0}


def test_a_new_run_replaces_only_its_own_contexts_series(dirs):
    textfile, state = dirs
    metrics.write(textfile, "n1", report(Context.CHECK, [XID79]), state_dir=state)
    metrics.write(textfile, "n1", report(Context.PROLOG, [HOT]), state_dir=state)
    fam = read(metrics.write(textfile, "n1", report(Context.CHECK), state_dir=state))
    assert [lab["context"] for lab, _ in fam["slurm_hooks_findings"]["samples"]] == ["prolog"]
    assert value(fam, "slurm_hooks_check_status", context="check") == 1


def test_two_nodes_on_one_host_share_the_file_without_clashing(dirs):
    textfile, state = dirs
    metrics.write(textfile, "n1", report(node="n1", findings=[XID79]), state_dir=state)
    fam = read(metrics.write(textfile, "n2", report(node="n2"), state_dir=state))
    assert value(fam, "slurm_hooks_check_status", node="n1") == 0
    assert value(fam, "slurm_hooks_check_status", node="n2") == 1


def test_remediation_counters_survive_across_runs(dirs):
    textfile, state = dirs
    metrics.write(textfile, "n1", report(findings=[XID79]), state_dir=state, remediations=["drain", "requeue"])
    metrics.write(textfile, "n1", report(Context.PROLOG), state_dir=state)
    fam = read(metrics.write(textfile, "n1", None, state_dir=state, remediations=[Action.DRAIN, "resume"]))
    counts = {lab["action"]: v for lab, v in fam["slurm_hooks_remediations_total"]["samples"]}
    assert counts == {"drain": 2, "requeue": 1, "resume": 1}
    with open(os.path.join(state, "metrics.json")) as fh:
        assert json.load(fh)["remediations"] == {"n1": {"drain": 2, "requeue": 1, "resume": 1}}


def test_label_values_are_escaped(dirs):
    textfile, state = dirs
    odd_check = 'we"ird\\check\nname'
    finding = Finding(odd_check, Severity.FAIL, Action.DRAIN, "x")
    path = metrics.write(textfile, 'node"1', report(node='node"1', findings=[finding]), state_dir=state)
    raw = open(path).read()
    assert r'check="we\"ird\\check\nname"' in raw
    fam = parse_exposition(raw)
    assert value(fam, "slurm_hooks_findings", node='node"1', check=odd_check) == 1


def test_no_textfile_dir_means_nothing_is_written(tmp_path):
    state = tmp_path / "state"
    assert metrics.write("", "n1", report(), state_dir=str(state), remediations=["drain"]) is None
    assert not state.exists()


def test_file_is_replaced_by_rename_so_a_reader_never_sees_half_a_file(dirs):
    textfile, state = dirs
    path = metrics.write(textfile, "n1", report(findings=[XID79]), state_dir=state)
    with open(path) as old:
        before = os.fstat(old.fileno()).st_ino
        metrics.write(textfile, "n1", report(), state_dir=state)
        assert "slurm_hooks_findings{" in old.read()  # the reader keeps the whole old file
    assert os.stat(path).st_ino != before
    assert os.listdir(textfile) == ["slurm_hooks.prom"]  # no temp file left behind, none named *.prom
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_unwritable_textfile_dir_is_reported_not_raised(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert metrics.write(str(blocker / "textfile"), "n1", report(), state_dir=str(tmp_path / "state")) is None
    assert "metrics not written" in capsys.readouterr().err


def test_corrupt_state_starts_afresh(dirs, capsys):
    textfile, state = dirs
    os.makedirs(state)
    with open(os.path.join(state, "metrics.json"), "w") as fh:
        fh.write("{half")
    fam = read(metrics.write(textfile, "n1", report(), state_dir=state, remediations=["drain"]))
    assert value(fam, "slurm_hooks_remediations_total", action="drain") == 1
    assert "starting afresh" in capsys.readouterr().err


def test_record_takes_directories_from_the_config(tmp_path):
    from slurm_hooks import config

    cfg = config.parse(f'[metrics]\ntextfile_dir = "{tmp_path}/tf"\n[state]\ndir = "{tmp_path}/st"\n', None)
    path = metrics.record(cfg, "n1", report(), remediations=["drain"])
    assert path == f"{tmp_path}/tf/slurm_hooks.prom"
    assert os.path.exists(f"{tmp_path}/st/metrics.json")


def test_prometheus_client_parser_agrees(dirs):
    parser = pytest.importorskip("prometheus_client.parser")
    textfile, state = dirs
    metrics.write(textfile, "n1", report(findings=[XID79]), state_dir=state, remediations=["drain"])
    path = metrics.write(textfile, "n1", report(Context.PROLOG), state_dir=state)
    fams = {f.name: f for f in parser.text_string_to_metric_families(open(path).read())}
    assert fams["slurm_hooks_remediations"].type == "counter"
    assert [s.value for s in fams["slurm_hooks_remediations"].samples] == [1.0]
    assert len(fams["slurm_hooks_check_status"].samples) == 2


def test_pending_actions_are_counted_per_node_until_cleared(dirs):
    textfile, state = dirs
    metrics.write(textfile, "n1", None, state_dir=state, pending=2)
    metrics.write(textfile, "n2", report(), state_dir=state, pending=1)
    path = metrics.write(textfile, "n1", report(), state_dir=state)  # None: n1's count stays
    fam = read(path)
    assert value(fam, "slurm_hooks_pending_actions", node="n1") == 2
    assert value(fam, "slurm_hooks_pending_actions", node="n2") == 1
    fam = read(metrics.write(textfile, "n1", None, state_dir=state, pending=0))
    assert value(fam, "slurm_hooks_pending_actions", node="n1") == 0


def test_the_bridge_writes_through_the_same_formatter_and_keeps_full_precision(tmp_path):
    from slurm_hooks.bridge import metrics as bridge_metrics

    path = bridge_metrics.write(str(tmp_path), {"slurm_hooks_bridge_last_pass_timestamp_seconds": 1700000000.25,
                                                "slurm_hooks_bridge_detached_nodes": 2})
    text = open(path).read()
    assert "slurm_hooks_bridge_last_pass_timestamp_seconds 1700000000.25\n" in text  # not 1.7e+09
    assert "# HELP slurm_hooks_bridge_detached_nodes Owned nodes no Slurm node maps to any more" in text
    assert [f for f in os.listdir(tmp_path)] == ["slurm_hooks_bridge.prom"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_seconds_from_fault_to_requeue_are_summed_by_kind(dirs):
    textfile, state = dirs
    metrics.write(textfile, "n1", None, state_dir=state, requeue_seconds=[("self", 3.5)])
    path = metrics.write(textfile, "n1", None, state_dir=state, requeue_seconds=[("self", 1.5), ("ours", 0.6)])
    fam = read(path)
    assert fam["slurm_hooks_requeue_seconds"]["type"] == "summary"
    by = {(lab["__name__"], lab["kind"]): v for lab, v in fam["slurm_hooks_requeue_seconds"]["samples"]}
    assert by == {("slurm_hooks_requeue_seconds_sum", "ours"): 0.6, ("slurm_hooks_requeue_seconds_count", "ours"): 1,
                  ("slurm_hooks_requeue_seconds_sum", "self"): 5.0, ("slurm_hooks_requeue_seconds_count", "self"): 2}


def test_the_fleet_status_is_two_gauges_per_node_we_hold():
    from slurm_hooks.observe import metrics

    text = metrics.render_status([
        {"node": "n1", "tag": "[replace]", "next": "a person", "waited_s": 266400.0},
        {"node": "n5", "tag": "[reboot 1/1]", "next": "slurm-hooks", "waited_s": None}])
    assert 'slurm_hooks_node_held_seconds{node="n1",tag="[replace]",next="a person"} 266400.0' in text
    assert 'slurm_hooks_node_held_seconds{node="n5",tag="[reboot 1/1]",next="slurm-hooks"} 0.0' in text
    assert 'slurm_hooks_waiting_for_person{node="n1"} 1' in text
    assert 'slurm_hooks_waiting_for_person{node="n5"} 0' in text
    assert text.count("# TYPE ") == 2

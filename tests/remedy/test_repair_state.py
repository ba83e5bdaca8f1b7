"""The repair state file: today's JSON reads and writes unchanged; an unreadable one raises."""

from __future__ import annotations

import json

import pytest

from slurm_hooks.remedy.repair import state as repair_state
from slurm_hooks.remedy.repair.state import Attempt, Phase, RepairState, RepairStateUnreadable, Stopped

#: A state file as hooks/repair.py wrote it before this module: a reset that failed, a reboot under
#: way, services a worker stopped, and a key this version does not know.
TODAY = """{"version": 1, "attempts": [{"rung": "reset", "t": 1764650000.5, "result": "failed",
 "gpus": ["GPU-8c1f"], "summary": "row remap on GPU 0"}, {"rung": "reboot", "t": 1764650100,
 "result": "recalled", "gpus": ["GPU-8c1f"], "summary": "row remap on GPU 0"}],
 "active": {"rung": "reboot", "t": 1764650200.0, "boot": "b-1", "reason": "slurm-hooks: row remap on GPU 0 [reboot 2/2]",
 "why": "w", "summary": "row remap on GPU 0", "gpus": [[0, "GPU-8c1f"]], "findings": [["row-remap", 0]]},
 "stopped": {"services": ["nvidia-persistenced"], "t": 1764650150.0, "pid": 42},
 "validating": {"t": 1764650300.0, "after": "reboot", "tries": 1, "summary": "s", "result": "running"},
 "replaced": {"t": 1, "reason": "r", "gpus": [], "recalled": true}, "later": {"x": 1}}"""


def test_a_state_file_written_by_the_dict_ladder_loads_and_writes_back_the_same(tmp_path):
    path = tmp_path / "repair-n1.json"
    path.write_text(TODAY)
    state = repair_state.load(str(path))
    assert [(a.rung, a.result, a.gpus) for a in state.attempts] == [("reset", "failed", ("GPU-8c1f",)),
                                                                     ("reboot", "recalled", ("GPU-8c1f",))]
    assert state.phase is Phase.REBOOTING and state.active.boot == "b-1" and state.busy
    assert state.active.gpus == ((0, "GPU-8c1f"),) and state.active.findings == (("row-remap", 0),)
    assert state.stopped == Stopped(("nvidia-persistenced",), 1764650150.0, 42)
    assert (state.validating.after, state.validating.tries, state.validating.reason) == ("reboot", 1, "")
    assert state.replaced.recalled and state.replaced.gpus == ()
    assert state.to_json() == json.loads(TODAY)


def test_keys_a_record_does_not_know_ride_along_and_an_empty_record_reads_as_none():
    data = {"version": 1, "attempts": [{"rung": "reset", "t": 1, "result": "ok", "gpus": [], "summary": "",
                                        "new": 1}],
            "active": {"t": 2, "boot": "b", "later": [1]}, "validating": {}, "stopped": {}, "replaced": {}}
    state = RepairState.from_json(data)
    assert state.attempts[0].extra == {"new": 1} and state.active.extra == {"later": [1]}
    assert state.validating is None and state.stopped is None and state.replaced is None
    out = state.to_json()
    assert out["attempts"][0]["new"] == 1 and out["active"]["later"] == [1] and out["active"]["rung"] == "reboot"
    assert set(out) == {"version", "attempts", "active"}


def test_a_change_is_a_new_state_the_one_read_unchanged():
    before = RepairState(attempts=(Attempt("reset", 5.0, "started", ("g",)),))
    after = before.settled(before.attempts[0], "ok")
    assert [a.result for a in after.attempts] == ["ok"] and [a.result for a in before.attempts] == ["started"]
    assert before.since(6.0).attempts == () and before.since(5.0) is before


def test_a_state_written_now_reads_as_the_dict_ladder_reads_it(tmp_path):
    state = RepairState.from_json({"version": 1, "attempts": [{"rung": "reset", "t": 5.0, "result": "ok",
                                                               "gpus": ["g"], "summary": "s"}]})
    data = json.loads(json.dumps(state.to_json()))
    assert isinstance(data.get("attempts"), list) and data["attempts"][0]["rung"] == "reset"
    assert data["attempts"][0]["t"] == 5.0 and data["attempts"][0]["gpus"] == ["g"]
    assert "active" not in data and "validating" not in data


def test_no_state_file_is_an_empty_state(tmp_path):
    state = repair_state.load(str(tmp_path / "repair-n1.json"))
    assert state.attempts == () and state.phase is Phase.IDLE and not state.busy


@pytest.mark.parametrize("text", ["{not json", "[]", '{"attempts": {}}', '{"version": 1}',
                                  '{"attempts": [{"t": 1}]}', '{"attempts": [], "active": "yes"}',
                                  '{"attempts": [{"rung": "reset", "t": "soon", "gpus": []}]}'])
def test_an_unreadable_state_file_raises_a_typed_error_naming_it(tmp_path, text):
    path = tmp_path / "repair-n1.json"
    path.write_text(text)
    with pytest.raises(RepairStateUnreadable, match="repair-n1.json"):
        repair_state.load(str(path))

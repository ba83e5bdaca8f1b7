"""fsutil.read_json: the one JSON reader, and the rule each caller writes for a missing or bad file."""

from __future__ import annotations

import os

import pytest

from slurm_hooks import fsutil


class Unreadable(Exception):
    pass


def _write(path, data: bytes | str) -> str:
    with open(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    return str(path)


def test_a_document_is_returned_as_it_is_whatever_its_shape(tmp_path):
    assert fsutil.read_json(_write(tmp_path / "a.json", '{"a": [1, 2.5, null]}'), missing=None, error=None) == \
        {"a": [1, 2.5, None]}
    assert fsutil.read_json(_write(tmp_path / "b.json", "[1]"), missing={}, error={}) == [1]
    assert fsutil.read_json(_write(tmp_path / "c.json", "null"), missing={}, error={}) is None


def test_a_value_is_returned_for_a_missing_file_and_for_a_bad_one(tmp_path):
    missing, bad = object(), object()
    assert fsutil.read_json(str(tmp_path / "none.json"), missing=missing, error=bad) is missing
    assert fsutil.read_json(_write(tmp_path / "torn.json", '{"a": '), missing=missing, error=bad) is bad
    assert fsutil.read_json(_write(tmp_path / "bytes.json", b'{"a": "\xff"}'), missing=missing, error=bad) is bad
    assert fsutil.read_json(str(tmp_path), missing=missing, error=bad) is bad  # a directory: an OSError


def test_an_exception_class_is_raised_with_the_path_and_the_reason(tmp_path):
    path = _write(tmp_path / "torn.json", "{")
    with pytest.raises(Unreadable) as got:
        fsutil.read_json(path, missing=None, error=Unreadable)
    assert str(got.value).startswith(f"{path}: unreadable JSON (Expecting property name")
    assert got.value.__suppress_context__  # raised `from None`: one line, not json's traceback too
    with pytest.raises(Unreadable, match=r"^thing at .*torn.json is bad: Expecting property name"):
        fsutil.read_json(path, missing=None, error=Unreadable, message="thing at {path} is bad: {reason}")
    with pytest.raises(FileNotFoundError, match="none.json"):
        fsutil.read_json(str(tmp_path / "none.json"), missing=FileNotFoundError, error=None)


def test_an_exception_is_raised_as_it_is(tmp_path):
    told = Unreadable("no such thing here")
    with pytest.raises(Unreadable) as got:
        fsutil.read_json(str(tmp_path / "none.json"), missing=told, error=Unreadable)
    assert got.value is told


def test_a_function_is_called_with_the_message_and_its_answer_returned(tmp_path):
    said: list[str] = []
    path = _write(tmp_path / "torn.json", "[1,")

    def afresh(message: str) -> dict:
        said.append(message)
        return {"fresh": True}

    assert fsutil.read_json(path, missing={}, error=afresh, message="{path}: starting afresh: {reason}") == \
        {"fresh": True}
    assert said == [f"{path}: starting afresh: Expecting value: line 1 column 4 (char 3)"]
    assert fsutil.read_json(str(tmp_path / "none.json"), missing={}, error=afresh) == {}
    assert len(said) == 1  # a missing file follows its own rule


def test_a_missing_directory_is_a_missing_file_and_a_file_in_the_path_a_bad_one(tmp_path):
    assert fsutil.read_json(str(tmp_path / "no" / "such.json"), missing="missing", error="bad") == "missing"
    plain = _write(tmp_path / "plain", "{}")
    assert fsutil.read_json(os.path.join(plain, "x.json"), missing="missing", error="bad") == "bad"


def test_the_rules_are_keyword_only_and_required(tmp_path):
    with pytest.raises(TypeError):
        fsutil.read_json(str(tmp_path / "x.json"))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fsutil.read_json(str(tmp_path / "x.json"), None, None)  # type: ignore[misc]

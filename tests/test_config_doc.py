"""docs/configuration.md is generated from the config schema (tools/gen_config_doc.py): a key added,
removed or given another default fails here until the page is written again, and the example
configs keep every key in its own table."""

from __future__ import annotations

import importlib.util
import os

import pytest
from paths import ROOT

from slurm_hooks import config

REGENERATE = "run `.venv/bin/python tools/gen_config_doc.py` and commit docs/configuration.md"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_config_doc", os.path.join(ROOT, "tools", "gen_config_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page() -> str:
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        return fh.read()


def _section(page: str, table: str) -> str:
    """The text of one table's part of the page, from its heading to the next one."""
    for level in ("## ", "### "):
        head = f"\n{level}`[{table}]`\n"
        if head in page:
            return page.split(head, 1)[1].split("\n#", 1)[0]
    raise AssertionError(f"docs/configuration.md has no heading for [{table}]: {REGENERATE}")


def test_the_configuration_page_is_what_the_schema_generates(gen):
    assert _page() == gen.render(), f"docs/configuration.md is out of date with slurm_hooks/config.py: {REGENERATE}"


@pytest.mark.parametrize("schema", ["SCHEMA", "BRIDGE_SCHEMA"])
def test_every_key_is_on_the_page_with_its_default(gen, schema):
    page = _page()
    for table, keys in getattr(config, schema).items():
        text = _section(page, table)
        for key, (_, default) in keys.items():
            if table == "notify" and key in config.DESTINATION_KEYS:
                continue  # a list of tables: its own heading, checked below
            row = f"| `{key}` | "
            assert row in text, f"[{table}] {key} is not on docs/configuration.md: {REGENERATE}"
            shown = text.split(row, 1)[1].split("\n", 1)[0]
            assert f"`{gen.toml_value(default)}`" in shown.replace("\\|", "|"), \
                f"[{table}] {key}: the page does not show the default {default!r}: {REGENERATE}"


def test_every_receiver_key_is_on_the_page(gen):
    page = _page()
    for kind, keys in config.DESTINATION_KEYS.items():
        text = _section(page, f"[notify.{kind}]")
        for key in keys:
            assert f"| `{key}` | " in text, f"[[notify.{kind}]] {key} is not on docs/configuration.md: {REGENERATE}"


def test_a_key_added_to_the_schema_shows_on_the_page_with_its_default(gen, monkeypatch):
    monkeypatch.setitem(config.SCHEMA, "watch", {**config.SCHEMA["watch"], "new_key": (int, 7)})
    text = _section(gen.render(), "watch")
    assert "| `new_key` | integer | `7` |" in text
    assert gen.render() != _page()  # what the first test would catch


def test_every_key_of_the_schema_is_in_its_own_table_of_the_example_config(gen):
    words, _ = gen.read_trailing(gen.EXAMPLE)
    # a key is found only inside its own table; a key without words is found through the example's text
    with open(gen.EXAMPLE, encoding="utf-8") as fh:
        text = fh.read()
    for table, keys in config.SCHEMA.items():
        body = text.split(f"\n[{table}]\n", 1)
        assert len(body) == 2, f"[{table}] is not in {gen.EXAMPLE}"
        part = body[1].split("\n[", 1)[0]
        for key in keys:
            assert (table, key) in words or f"{key} =" in part, f"[{table}] {key} is not in [{table}] of the example config"


def test_every_bridge_key_has_words_in_the_bridge_example(gen):
    words = gen.read_above(gen.BRIDGE_EXAMPLE)
    for table, keys in config.BRIDGE_SCHEMA.items():
        for key in keys:
            assert (table, key) in words, f"[{table}] {key}: no comment above it in conf/bridge.example.toml"


def test_the_check_mode_says_the_command_that_regenerates_the_page(gen, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text("# Configuration\n")
    monkeypatch.setattr(gen, "PAGE", str(stale))
    assert gen.main(["--check"]) == 1
    assert "python tools/gen_config_doc.py" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0

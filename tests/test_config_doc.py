"""docs/configuration.md is generated from the config schema (tools/gen_config_doc.py): a key added,
removed or given another default fails here until the page is written again, and the example
configs keep every key in its own table."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from paths import ROOT

from slurm_hooks import config
from slurm_hooks.bridge import settings as bridge_settings
from slurm_hooks.config import receivers
from slurm_hooks.values import dataclass, setting

SHIPPED = os.path.join(ROOT, "slurm_hooks", "templates", "install", "config.toml")
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
    assert _page() == gen.render(), f"docs/configuration.md is out of date with slurm_hooks/config/sections.py: {REGENERATE}"


def test_the_example_config_is_what_the_sections_generate(gen):
    with open(gen.EXAMPLE, encoding="utf-8") as fh:
        assert fh.read() == gen.render_example(), \
            f"{gen.EXAMPLE} is out of date with slurm_hooks/config/sections.py: run `.venv/bin/python tools/gen_config_doc.py`"


def test_the_example_config_has_every_key_in_its_own_table_at_its_default():
    from slurm_hooks.values import fields

    text = open(SHIPPED, encoding="utf-8").read()
    for table, cls in config.SECTIONS.items():
        part = text.split(f"\n[{table}]\n", 1)[1].split("\n[", 1)[0]
        for f in fields(cls):
            assert re.search(rf"^(# )?{f.name} = ", part, re.M), f"[{table}] {f.name} is not in [{table}] of {SHIPPED}"


def _tables(gen):
    """(table, its key fields) for every table of the node side and of the bridge."""
    for table, cls in config.SECTIONS.items():
        yield table, gen.keys(cls, tuple(config.DESTINATION_KEYS) if table == "notify" else ())
    for table, cls in bridge_settings.TABLES.items():
        yield table, gen.keys(cls, bridge_settings.SUBTABLES)


def test_every_key_is_on_the_page_with_its_default(gen):
    page = _page()
    for table, keys in _tables(gen):
        text = _section(page, table)
        for f in keys:
            row = f"| `{f.name}` | "
            assert row in text, f"[{table}] {f.name} is not on docs/configuration.md: {REGENERATE}"
            shown = text.split(row, 1)[1].split("\n", 1)[0]
            assert f"`{gen.toml_value(gen.default(f))}`" in shown.replace("\\|", "|"), \
                f"[{table}] {f.name}: the page does not show the default {gen.default(f)!r}: {REGENERATE}"


def test_every_receiver_key_is_on_the_page(gen):
    page = _page()
    for kind, cls in receivers.TABLES.items():
        text = _section(page, f"[notify.{kind}]")
        for f in gen.keys(cls):
            assert f"| `{f.name}` | " in text, f"[[notify.{kind}]] {f.name} is not on docs/configuration.md: {REGENERATE}"


def test_a_key_added_to_a_section_shows_on_the_page_with_its_default_and_words(gen, monkeypatch):
    @dataclass(frozen=True)
    class Watch(config.WatchSection):
        new_key: int = setting(7, doc="a key added to the class")

    monkeypatch.setitem(config.SECTIONS, "watch", Watch)
    text = _section(gen.render(), "watch")
    assert "| `new_key` | integer | `7` | >= 0 | a key added to the class |" in text
    assert gen.render() != _page()  # what the first test would catch
    example = gen.render_example().split("\n[watch]\n", 1)[1].split("\n[", 1)[0]
    assert re.search(r"^new_key = 7 +# a key added to the class$", example, re.M)
    assert config.parse("[watch]\nnew_key = 9\n").watch.new_key == 9  # and the file takes it


def test_every_key_has_words_or_says_none_are_needed(gen):
    for table, keys in _tables(gen):
        for f in keys:
            if table == "repair" and f.name in ("enabled", "nvidia_smi", "systemctl"):
                continue  # said by the table's words, or by its name
            assert "doc" in (f.metadata or {}), f"[{table}] {f.name} has no doc"


def test_every_bridge_key_is_in_the_bridge_example(gen):
    with open(gen.BRIDGE_EXAMPLE, encoding="utf-8") as fh:
        text = fh.read()
    for table in bridge_settings.TABLES:
        part = text.split(f"\n[{table}]\n", 1)[1].split("\n[", 1)[0]
        for key in bridge_settings.keys(table):
            assert f"\n{key} = " in f"\n{part}", f"[{table}] {key} is not in conf/bridge.example.toml"


def test_the_check_mode_says_the_command_that_regenerates_the_page(gen, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text("# Configuration\n")
    example = tmp_path / "config.toml"  # never the checkout's own files: another test may be reading them
    example.write_text(gen.render_example())
    monkeypatch.setattr(gen, "PAGE", str(stale))
    monkeypatch.setattr(gen, "EXAMPLE", str(example))
    assert gen.main(["--check"]) == 1
    assert "python tools/gen_config_doc.py" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    example.write_text("# stale\n")
    assert gen.main(["--check"]) == 1 and "config.toml" in capsys.readouterr().err
    assert gen.main([]) == 0 and example.read_text() == gen.render_example()

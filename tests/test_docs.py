"""Docs that cannot drift: every ``slurm-hooks ...`` command line shown in README.md, docs/ and docs/dev/
runs with ``--help`` (click parses the whole line first, so a renamed command or option fails),
every path under the install prefix they name is one ``slurm-hooks install`` lays, and every
file of the checkout they name exists."""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest
from paths import ROOT

from slurm_hooks import __version__
from slurm_hooks.cli import COMMANDS
from slurm_hooks.cli import main as cli_main
from slurm_hooks.install import apply, layout

#: Every page: the README, docs/ and docs/dev/.
DOCS = sorted([os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md")),
               *glob.glob(os.path.join(ROOT, "docs", "dev", "*.md"))])
_FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")


def _code(text: str) -> list[str]:
    """The code in a markdown text: each line of a fenced block (continuations joined, comments cut;
    TOML, YAML and JSON blocks left out) and each inline code span."""
    out = []
    for lang, body in _FENCE.findall(text):
        if lang in ("toml", "yaml", "json"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            out.append(line.split(" #", 1)[0])
    out += [m.replace("\n", " ") for m in _INLINE.findall(_FENCE.sub("", text))]
    return out


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv after `slurm-hooks`) for every command line shown; placeholders made concrete:
    ``[--x]`` -> ``--x``, ``a|b`` -> ``a``, ``...`` dropped."""
    found = []
    for doc in DOCS:
        for line in _code(open(doc, encoding="utf-8").read()):
            words = _words(line)
            for i, w in enumerate(words):
                if os.path.basename(w) != "slurm-hooks" or i + 1 >= len(words) or words[i + 1] not in COMMANDS:
                    continue
                args = []
                for a in words[i + 1:]:
                    a = a.strip("[]")
                    if a in ("", "...", "\\") or a.startswith(("<", "#")):
                        continue
                    args.append(a.split("|")[0])
                found.append((f"{os.path.basename(doc)}: {line.strip()}", args))
    return found


LINES = command_lines()


def test_the_docs_show_command_lines():
    assert len(LINES) > 20  # the extraction itself works


def test_every_page_is_read():
    names = {os.path.relpath(doc, ROOT) for doc in DOCS}
    assert {"README.md", "docs/install.md", "docs/dev/testing.md"} <= names


@pytest.mark.parametrize("where, args", LINES, ids=[w for w, _ in LINES])
def test_every_command_line_in_the_docs_parses(where, args, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main([*args, "--help"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, f"{where}: {out.err.strip()}"
    assert "Usage: slurm-hooks " + args[0] in out.out


def _paths_under_prefix(text: str) -> set[str]:
    return set(re.findall(r"/opt/slurm-hooks(/[\w./-]*[\w])", text))


def test_every_path_under_the_install_prefix_the_docs_name_is_laid_by_install(tmp_path):
    prefix = tmp_path / "opt"
    inputs = layout.Inputs(prefix=str(prefix), python="/usr/bin/python3", config=str(tmp_path / "c.toml"),
                           state_dir=str(tmp_path / "s"), audit=str(tmp_path / "a.jsonl"))
    apply.install(inputs)
    venv = f"/venv-{__version__}"
    for doc in DOCS:
        for rel in sorted(_paths_under_prefix(open(doc, encoding="utf-8").read())):
            if rel.startswith("/venv-"):
                # the venv the docs make for this version; only its programs are named
                assert rel.split("/bin/")[0] in (venv, "/venv-0.2.0"), f"{doc}: /opt/slurm-hooks{rel}"
                assert rel == rel.split("/bin/")[0] or rel.rsplit("/", 1)[-1] in ("slurm-hooks", "pip", "python"), \
                    f"{doc}: /opt/slurm-hooks{rel}"
                continue
            if rel.startswith("/versions/"):
                continue
            assert os.path.lexists(str(prefix) + rel), f"{os.path.basename(doc)} names /opt/slurm-hooks{rel}, " \
                                                      "which `slurm-hooks install` does not lay"


_REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|bench|conf|docs|scripts|tools|examples|slurm_hooks)/[\w./-]*\w)")


def test_every_file_of_the_checkout_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        for line in _code(open(doc, encoding="utf-8").read()):
            for rel in _REPO_PATH.findall(line):
                if "*" in rel or rel.endswith("/"):
                    continue
                if not os.path.exists(os.path.join(ROOT, rel)):
                    missing.append(f"{os.path.basename(doc)}: {rel}")
    assert missing == []


def test_the_version_the_docs_install_is_this_one():
    for doc in DOCS:
        for v in re.findall(r"venv-(\d[\w.]*\d)", open(doc, encoding="utf-8").read()):
            assert v in (__version__, "0.2.0"), f"{doc}: venv-{v}"  # 0.2.0: the upgrade example


def test_the_bridge_example_lists_every_bridge_key():
    from slurm_hooks.bridge import settings

    text = open(os.path.join(ROOT, "conf", "bridge.example.toml"), encoding="utf-8").read()
    for table in settings.TABLES:
        keys = settings.keys(table)
        body = text.split(f"\n[{table}]\n", 1)
        assert len(body) == 2, f"[{table}] is not in conf/bridge.example.toml"
        section = body[1].split("\n[", 1)[0]
        for key in keys:
            assert re.search(rf"^#?\s*{key}\s*=", section, re.M), f"[{table}] {key} is not in conf/bridge.example.toml"


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_relative_link_of_a_page_names_a_file_that_exists():
    broken = []
    for doc in DOCS:
        for target in _LINK.findall(open(doc, encoding="utf-8").read()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not os.path.exists(os.path.join(os.path.dirname(doc), target)):
                broken.append(f"{os.path.relpath(doc, ROOT)}: {target}")
    assert broken == []


def test_the_readme_is_a_map_of_every_page():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    linked = {os.path.normpath(t) for t in _LINK.findall(text)}
    pages = {os.path.relpath(doc, ROOT) for doc in DOCS} - {"README.md"}
    assert pages - linked == set(), "pages the README does not link to"
    assert len(text.splitlines()) < 250, "the README is the admin's map: move detail into docs/"


def test_the_readmes_two_commands_exist_and_ci_runs_them():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    for command in ("./scripts/demo", "./scripts/test"):
        assert re.search(rf"^{re.escape(command)}\s", text, re.M), f"README.md no longer shows {command}"
        assert os.access(os.path.join(ROOT, command), os.X_OK), f"{command} is not an executable file"
        assert command in ci, f".ci/run does not run {command}"


def test_the_install_page_shows_the_readmes_install_lines():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = readme[readme.index("<!-- install-section:"):].split("```sh\n", 1)[1].split("```", 1)[0]
    assert f"```sh\n{lines}```" in open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8").read()

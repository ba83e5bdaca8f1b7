"""Docs that cannot drift: every ``slurm-hooks ...`` command line shown in README.md, docs/ and docs/dev/
runs with ``--help`` (click parses the whole line first, so a renamed command or option fails),
every path under the install prefix they name is one ``slurm-hooks install`` lays, every
file of the checkout they name exists, and every measured figure is either written by a bench
(its block as the bench wrote it, naming a commit of this repository) or in a dated note."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
import subprocess

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


_REPO_PATH = re.compile(r"(?<![\w./-])((?:tests|bench|conf|docs|scripts|tools|examples|slurm_hooks)/[\w./*-]*\w)")


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


def _load_docblock():
    spec = importlib.util.spec_from_file_location("docblock", os.path.join(ROOT, "bench", "docblock.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docblock = _load_docblock()


def _text(doc: str) -> str:
    return open(doc, encoding="utf-8").read()


def test_every_generated_block_is_as_its_bench_wrote_it():
    """A hand edit of a bench's figures (or of its stamp) changes the digest the bench wrote."""
    found = 0
    for doc in DOCS:
        for b in docblock.blocks(_text(doc)):
            found += 1
            where = f"{os.path.relpath(doc, ROOT)}: {b['name']}"
            assert os.path.exists(os.path.join(ROOT, "bench", f"{b['name']}.py")), where
            if b["commit"] is None:
                assert b["body"] == "", f"{where}: 'not yet run' but it holds text"
                continue
            assert b["digest"] == docblock.digest(b["name"], b["commit"], b["date"], b["body"]), \
                f"{where}: edited by hand (its digest no longer matches): run python bench/{b['name']}.py again"
    assert found >= 4  # bench_check, bench_storm32, bench_tests, bench_isolate


def test_a_generated_block_edited_by_hand_is_told_apart():
    body = "| x | 1.0 |\n"
    stamp = docblock.digest("bench_x", "95f4d47", "2026-12-03", body)
    page = f"<!-- bench_x: written by bench/bench_x.py at 95f4d47, 2026-12-03; sha256 {stamp} -->\n{body}<!-- /bench_x -->\n"
    [b] = docblock.blocks(page)
    assert b["digest"] == docblock.digest(b["name"], b["commit"], b["date"], b["body"])
    [edited] = docblock.blocks(page.replace("1.0", "0.9"))
    assert edited["digest"] != docblock.digest(edited["name"], edited["commit"], edited["date"], edited["body"])


def _commits_named() -> dict[str, list[str]]:
    """commit -> where: every generated block's and every dated note's."""
    named: dict[str, list[str]] = {}
    for doc in DOCS:
        rel = os.path.relpath(doc, ROOT)
        text = _text(doc)
        for b in docblock.blocks(text):
            if b["commit"]:
                named.setdefault(b["commit"], []).append(f"{rel}: {b['name']}")
        for body in docblock.notes(text):
            head = docblock.NOTE_HEAD.match(body)
            assert head, f"{rel}: a dated note must open with '*Dated note (YYYY-MM-DD, ... COMMIT ...):*': {body[:80]!r}"
            for commit in re.findall(r"[0-9a-f]{7,40}", head.group("commits")):
                named.setdefault(commit, []).append(f"{rel}: dated note of {head.group('date')}")
    return named


def test_every_figure_names_a_commit_of_this_repository():
    named = _commits_named()
    assert len(named) >= 5
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True, timeout=30).returncode != 0:
        pytest.skip("not a git checkout: the commits the figures name cannot be looked up")
    missing = [f"{c} ({', '.join(where)})" for c, where in sorted(named.items())
               if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT, capture_output=True,
                                 timeout=30).returncode != 0]
    assert missing == [], "commits not in this repository"


#: A measured figure: a decimal with its unit, or milliseconds.
_FIGURE = re.compile(r"(?<![\w.])(?:\d+\.\d+ ?(?:ms|s|x|MiB|GiB|%)|\d+ ms)(?!\w)")
#: Figures that are settings or a test's set-up, not measurements.
SETTINGS = {
    "docs/bridge.md": ("0.5 s doubling", "from 0.5 s capped"),
    "docs/checkpoint.md": ("every 0.1 s",),
}
#: Pages another part of the work rewrites; their figures are theirs to mark.
NOT_YET: tuple[str, ...] = ()


def _prose(text: str) -> str:
    """The page without its code, generated blocks and dated notes (blanked, so offsets hold)."""
    spans = docblock.spans(text) + [m.span() for m in _FENCE.finditer(text)]
    spans += [m.span() for m in _INLINE.finditer(text)]
    chars = list(text)
    for start, end in spans:
        chars[start:end] = ["\n" if c == "\n" else " " for c in chars[start:end]]
    return "".join(chars)


def test_every_measured_figure_is_written_by_a_bench_or_in_a_dated_note():
    loose = []
    for doc in DOCS:
        rel = os.path.relpath(doc, ROOT)
        if rel in NOT_YET:
            continue
        prose = _prose(_text(doc))
        for n, line in enumerate(prose.splitlines(), 1):
            for allowed in SETTINGS.get(rel, ()):
                line = line.replace(allowed, "")
            loose += [f"{rel}:{n}: {m}" for m in _FIGURE.findall(line)]
    assert loose == [], "figures typed by hand: write them with a bench (bench/docblock.py) or mark them a dated note"


# --- snippets marked to run: run as written ------------------------------------------------------

_RUNS = re.compile(r"^<!-- runs as written: tests/test_docs.py -->\n```sh\n(.*?)^```", re.M | re.S)
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)")
_EXIT = re.compile(r"#\s*exit (\d+)\s*$")


def runnable() -> list[tuple[str, str]]:
    """(page, block) for every ```sh block right after a ``<!-- runs as written: ... -->`` marker."""
    return [(os.path.basename(doc), m.group(1)) for doc in DOCS
            for m in _RUNS.finditer(open(doc, encoding="utf-8").read())]


def steps(block: str) -> tuple[str, list[tuple[str, int, list[str]]]]:
    """The block as a bash script that says each command's exit code after it, and each command with
    the exit code its ``# exit N`` expects (0 unless said) and the texts its ``# prints:`` lines say."""
    script, found, heredoc = [], [], ""
    for line in block.splitlines():
        script.append(line)
        if heredoc:
            heredoc = "" if line.strip() == heredoc else heredoc
            if not heredoc:
                script.append(f'echo "@@step {len(found) - 1} rc=$?@@"')
            continue
        text = line.strip()
        if text.startswith("# prints:"):
            found[-1][2].append(text[len("# prints:"):].strip())
            continue
        if not text or text.startswith("#"):
            continue
        m = _EXIT.search(text)
        found.append((text, int(m.group(1)) if m else 0, []))
        heredoc = (_HEREDOC.search(text.split(" #")[0]) or [None, ""])[1]
        if not heredoc:
            script.append(f'echo "@@step {len(found) - 1} rc=$?@@"')
    return "\n".join(script) + "\n", found


def test_the_docs_mark_snippets_to_run():
    assert [page for page, _ in runnable()] == ["operations.md"]  # the rehearsal


@pytest.mark.parametrize("page,block", runnable(), ids=[p for p, _ in runnable()])
def test_every_snippet_marked_to_run_runs_as_written_for_a_newcomer(page, block, tmp_path):
    """As a newcomer pastes it: in an empty directory, with this checkout's `slurm-hooks` on PATH and
    no config, Slurm or node name of this machine in the environment; each command exits as its
    comment says and prints what its ``# prints:`` line says; nothing outside that directory is used."""
    import sys

    script, expected = steps(block)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLURM_HOOKS_CONFIG", "SLURM_CONF", "SLURMD_NODENAME", "SLURM_HOOKS_DEBUG")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    outputs = re.split(r"@@step (\d+) rc=(\d+)@@\n", r.stdout)
    said = {int(outputs[i]): (int(outputs[i + 1]), outputs[i - 1]) for i in range(1, len(outputs) - 1, 3)}
    for n, (line, rc, prints) in enumerate(expected):
        assert n in said, f"{page}: `{line}` did not run\n{r.stdout}\n{r.stderr}"
        got, out = said[n]
        assert got == rc, f"{page}: `{line}` exited {got}, the page says {rc}\n{out}\n{r.stderr}"
        for text in prints:
            assert text in out, f"{page}: `{line}` did not print {text!r}\n{out}"
    assert not any(os.path.isabs(p) and not p.startswith(str(tmp_path)) for p in _written(tmp_path))


def _written(root) -> list[str]:
    """The paths the config files a snippet wrote point at (each must be under ``root``)."""
    out = []
    for path in glob.glob(os.path.join(str(root), "**", "*.toml"), recursive=True):
        out += re.findall(r'=\s*"(/[^"]*)"', open(path, encoding="utf-8").read())
    return out

"""The parsed config kept beside the file (slurm_hooks.config.cache): used only when it was made from the
file's very text by this user, so an edit, a corrupt cache or someone else's file never changes
what a run reads."""

from __future__ import annotations

import contextlib
import datetime
import marshal
import os
import subprocess
import sys

import pytest

from slurm_hooks import config
from slurm_hooks.config import cache as confcache


@pytest.fixture
def writing(monkeypatch):
    """As the hook programs run: a miss writes the cache."""
    monkeypatch.setattr(confcache, "_writing", True)


def _conf(tmp_path, gpus: int = 8) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f'[expect]\ngpus = {gpus}\n[state]\ndir = "{tmp_path}/state"\n')
    return str(path)


def _poison(path: str, gpus: int, mode: int = 0o600) -> None:
    """A cache for the file's real text whose table says ``gpus`` (so a test sees whether it was read)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    cache = confcache.cache_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cache)
    fd = os.open(cache, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(marshal.dumps((confcache._key(path, text), {"expect": {"gpus": gpus}})))


def test_a_hook_run_writes_the_cache_and_the_next_run_reads_it_without_a_toml_parser(tmp_path, writing):
    path = _conf(tmp_path)
    assert config.load(path).expect.gpus == 8
    cache = confcache.cache_path(path)
    assert os.stat(cache).st_mode & 0o777 == 0o600
    code = ("import sys\nfrom slurm_hooks import config\n"
            f"print(config.load({path!r}).expect.gpus, 'tomllib' in sys.modules, 'tomli' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["8", "False", "False"]


def test_other_commands_read_the_cache_but_leave_no_file_beside_the_config(tmp_path):
    path = _conf(tmp_path)
    assert config.load(path).expect.gpus == 8
    assert not os.path.exists(confcache.cache_path(path))


def test_a_cache_of_ours_is_what_a_run_reads(tmp_path):
    """The other tests' poisoned caches prove something only if a good one is indeed read."""
    path = _conf(tmp_path)
    _poison(path, 3)
    assert config.load(path).expect.gpus == 3


def test_an_edit_in_the_same_second_with_the_same_size_and_mtime_is_seen_at_once(tmp_path, writing):
    path = _conf(tmp_path, 8)
    assert config.load(path).expect.gpus == 8
    st = os.stat(path)
    _conf(tmp_path, 4)  # same length, same key, another value
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    assert config.load(path).expect.gpus == 4
    assert config.load(path).expect.gpus == 4  # and the cache now holds the new text


def test_a_corrupt_or_truncated_cache_is_ignored_and_replaced(tmp_path, writing):
    path = _conf(tmp_path)
    cache = confcache.cache_path(path)
    for junk in (b"", b"\x00garbage", marshal.dumps((1, 2, 3)), marshal.dumps(("x", [])),
                 marshal.dumps((confcache._key(path, "other text"), {"expect": {"gpus": 1}}))):
        fd = os.open(cache, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, junk)
        os.close(fd)
        assert config.load(path).expect.gpus == 8
    assert confcache.read(path, open(path).read()) == {"expect": {"gpus": 8}, "state": {"dir": f"{tmp_path}/state"}}


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_cache_others_could_write_is_never_read(tmp_path, mode):
    path = _conf(tmp_path)
    _poison(path, 3, mode)
    assert config.load(path).expect.gpus == 8


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_cache_owned_by_another_user_is_never_read(tmp_path):
    path = _conf(tmp_path)
    _poison(path, 3)
    os.chown(confcache.cache_path(path), 65534, 65534)
    assert config.load(path).expect.gpus == 8


def test_a_linked_cache_is_never_read(tmp_path):
    path = _conf(tmp_path)
    _poison(path, 3)
    cache = confcache.cache_path(path)
    os.link(cache, str(tmp_path / "elsewhere"))
    assert config.load(path).expect.gpus == 8
    os.unlink(str(tmp_path / "elsewhere"))
    os.rename(cache, str(tmp_path / "target"))
    os.symlink(str(tmp_path / "target"), cache)
    assert config.load(path).expect.gpus == 8


def test_a_cache_for_another_version_or_path_is_not_used(tmp_path, monkeypatch):
    path = _conf(tmp_path)
    _poison(path, 3)
    monkeypatch.setattr(confcache, "__version__", "0.0.0-other")
    assert config.load(path).expect.gpus == 8
    monkeypatch.undo()
    other = tmp_path / "copy.toml"
    other.write_text(open(path).read())
    os.rename(confcache.cache_path(path), confcache.cache_path(str(other)))
    assert config.load(str(other)).expect.gpus == 8


def test_a_table_marshal_cannot_keep_is_simply_not_cached(tmp_path, writing):
    path = _conf(tmp_path)
    confcache.write(path, "when = 1979-05-27\n", {"when": datetime.date(1979, 5, 27)})
    assert not os.path.exists(confcache.cache_path(path))


def test_a_directory_we_cannot_write_means_no_cache_and_no_error(tmp_path, writing):
    path = _conf(tmp_path)
    os.mkdir(confcache.cache_path(path))  # in the way of the rename
    assert config.load(path).expect.gpus == 8
    assert os.path.isdir(confcache.cache_path(path))


def test_errors_still_name_the_file_and_line_with_a_cache_of_the_bad_text(tmp_path, writing):
    path = tmp_path / "config.toml"
    path.write_text("[expect]\ngpus = 8\nbogus = 1\n")
    for _ in range(2):  # the second run reads the cached table and must fail the same way
        with pytest.raises(config.ConfigError) as err:
            config.load(str(path))
        assert "bogus" in str(err.value) and ":3" in str(err.value)
    path.write_text("[expect\n")
    with pytest.raises(config.ConfigError):
        config.load(str(path))

"""Lay the files of :mod:`slurm_hooks.install.layout` under a prefix, switch versions, and undo it.

- A version's files go to ``P/versions/<id>`` (written in a temp dir, then renamed in);
  ``P/current`` is a symlink replaced with one ``rename`` (the switch); the stable paths
  (``P/bin/slurm-hooks-prolog``, ...) are symlinks through ``P/current``. A prolog started
  during an upgrade runs the old version or the new one, never a mix.
- The manifest ``P/install-manifest.json`` names every file, link and directory an install
  made (with each file's sha256): ``uninstall`` removes exactly those, keeps a file someone
  changed since, and removes a directory only when it made it and it is empty.
- The same inputs lay the same bytes: a second install changes nothing, the manifest included.
- The current version and the one before stay (rollback = run the older venv's install);
  older ones are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from slurm_hooks import fsutil
from slurm_hooks.config import cache as confcache
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.install.layout import CURRENT, MANIFEST, VERSIONS, Inputs, Laid, example_config, render

_FORMAT = 1


class InstallError(SlurmHooksError):
    """The prefix holds something install did not lay where it would lay a file; nothing was changed."""


@dataclass
class Done:
    """What an install or uninstall did (or, dry, would do): one line per change."""

    lines: list[str] = field(default_factory=list)
    version_id: str = ""
    kept: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.lines)


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _file_sha(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return _sha(fh.read())
    except OSError:
        return None


def load_manifest(prefix: str) -> dict[str, Any] | None:
    path = os.path.join(prefix, MANIFEST)
    data = fsutil.read_json(path, missing=None, error=InstallError,
                            message="{path}: unreadable manifest ({reason}): move it away to start afresh")
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise InstallError(f"{path}: not a manifest this version reads (format {data.get('format')!r})")
    return data


@contextlib.contextmanager
def _prefix_lock(prefix: str) -> Iterator[None]:
    """One install at a time per prefix: a flock on the directory itself (no lock file left behind)."""
    fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _link_target(prefix: str, rel: str) -> str:
    """What the stable symlink at ``P/rel`` points to: the same file under ``P/current``."""
    return os.path.relpath(os.path.join(prefix, CURRENT, rel), os.path.dirname(os.path.join(prefix, rel)))


def _makedirs(path: str, created: list[str], dry: bool) -> None:
    """``mkdir -p`` recording each directory made, so that uninstall removes exactly those."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        if not dry:
            os.mkdir(d, 0o755)
            os.chmod(d, 0o755)
        if d not in created:
            created.append(d)


def install(inp: Inputs, *, write_config: bool = True, dry: bool = False) -> Done:
    """Lay ``inp``'s version under ``inp.prefix`` and switch to it. Raises InstallError, before
    changing anything, when a path it would lay holds something it did not lay."""
    prefix = os.path.abspath(inp.prefix)
    laid = render(inp)
    vid = laid.version_id
    done = Done(version_id=vid)
    old = load_manifest(prefix) if os.path.isdir(prefix) else None
    manifest = _fresh_manifest(prefix) if old is None else json.loads(json.dumps(old))
    _check_foreign(prefix, laid, old)
    created: list[str] = manifest["dirs"]
    _makedirs(prefix, created, dry)
    if dry and not os.path.isdir(prefix):
        done.lines += [f"create {prefix}/{VERSIONS}/{vid}", f"switch {prefix}/{CURRENT} -> {VERSIONS}/{vid}"]
        done.lines += [f"link {prefix}/{rel}" for rel in sorted(laid.files)]
        _config(inp, manifest, done, write_config, dry)
        return done
    with _prefix_lock(prefix):
        _makedirs(os.path.join(prefix, VERSIONS), created, dry)
        _clear_temps(prefix, dry)
        _lay_version(prefix, vid, laid, manifest, done, dry)
        for rel in sorted(laid.files):
            _makedirs(os.path.dirname(os.path.join(prefix, rel)), created, dry)
            _link(prefix, rel, manifest, done, dry)
        _switch(prefix, vid, manifest, done, dry)
        _prune(prefix, manifest, done, dry)
        _config(inp, manifest, done, write_config, dry)
        _write_manifest(prefix, manifest, old, dry)
    return done


def _fresh_manifest(prefix: str) -> dict[str, Any]:
    return {"format": _FORMAT, "prefix": prefix, "current": None, "previous": None, "versions": {},
            "links": [], "dirs": [], "config": None}


def _check_foreign(prefix: str, laid: Laid, manifest: dict[str, Any] | None) -> None:
    """Refuse to lay over a file or link install did not make (a site's own prolog, an old copy)."""
    ours = set(manifest["links"]) if manifest else set()
    for rel in sorted(laid.files):
        path = os.path.join(prefix, rel)
        if os.path.islink(path) and (rel in ours or os.readlink(path) == _link_target(prefix, rel)):
            continue
        if os.path.lexists(path):
            raise InstallError(f"{path} exists and was not laid by `slurm-hooks install`: move it away first "
                               "(nothing was changed)")
    cur = os.path.join(prefix, CURRENT)
    if os.path.lexists(cur) and not (os.path.islink(cur) and os.readlink(cur).startswith(VERSIONS + "/")):
        raise InstallError(f"{cur} exists and was not laid by `slurm-hooks install`: move it away first")


def _clear_temps(prefix: str, dry: bool) -> None:
    """A version half-written by an install that died (never switched to) is ours to remove."""
    vdir = os.path.join(prefix, VERSIONS)
    for name in os.listdir(vdir) if os.path.isdir(vdir) else ():
        if name.startswith(".tmp-") and not dry:
            shutil.rmtree(os.path.join(vdir, name), ignore_errors=True)
    for name in os.listdir(prefix):
        if name.startswith(f".{CURRENT}.tmp-") and not dry:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(prefix, name))


def _lay_version(prefix: str, vid: str, laid: Laid, manifest: dict[str, Any], done: Done, dry: bool) -> None:
    target = os.path.join(prefix, VERSIONS, vid)
    files = {rel: _sha(text) for rel, (text, _) in laid.files.items()}
    if os.path.isdir(target):
        # Laid before: put back only what someone changed since (a content hash names the version).
        for rel, (text, mode) in sorted(laid.files.items()):
            path = os.path.join(target, rel)
            st = os.lstat(path) if os.path.lexists(path) else None
            if st is None or _file_sha(path) != files[rel] or (st.st_mode & 0o7777) != mode:
                done.lines.append(f"restore {path}")
                if not dry:
                    fsutil.atomic_write(path, text, mode=mode)
    else:
        done.lines.append(f"create {target}")
        if not dry:
            tmp = os.path.join(prefix, VERSIONS, f".tmp-{vid}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            for rel, (text, mode) in laid.files.items():
                path = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                fsutil.atomic_write(path, text, mode=mode)
            for root, dirs, _ in os.walk(tmp):
                for d in dirs:
                    os.chmod(os.path.join(root, d), 0o755)
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
    manifest["versions"][vid] = {"files": files}


def _link(prefix: str, rel: str, manifest: dict[str, Any], done: Done, dry: bool) -> None:
    path = os.path.join(prefix, rel)
    want = _link_target(prefix, rel)
    if not (os.path.islink(path) and os.readlink(path) == want):
        done.lines.append(f"link {path} -> {want}")
        if not dry:
            tmp = f"{path}.tmp-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(want, tmp)
            os.replace(tmp, path)
    if rel not in manifest["links"]:
        manifest["links"].append(rel)


def _switch(prefix: str, vid: str, manifest: dict[str, Any], done: Done, dry: bool) -> None:
    """The one atomic step: ``P/current`` now names ``vid``."""
    cur = os.path.join(prefix, CURRENT)
    want = f"{VERSIONS}/{vid}"
    before = os.readlink(cur) if os.path.islink(cur) else None
    if before != want:
        done.lines.append(f"switch {cur} -> {want}" + (f" (was {before})" if before else ""))
        if not dry:
            tmp = os.path.join(prefix, f".{CURRENT}.tmp-{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(want, tmp)
            os.replace(tmp, cur)
            _fsync_dir(prefix)
    if manifest["current"] != vid:
        manifest["previous"] = manifest["current"]
        manifest["current"] = vid


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(prefix: str, manifest: dict[str, Any], done: Done, dry: bool) -> None:
    """Keep the current version and the one before it; remove older ones we laid."""
    keep = {manifest["current"], manifest["previous"]}
    for vid in sorted(set(manifest["versions"]) - keep):
        kept = _remove_version(prefix, vid, manifest["versions"][vid], done, dry)
        done.kept += kept
        del manifest["versions"][vid]


def _remove_version(prefix: str, vid: str, entry: dict[str, Any], done: Done, dry: bool) -> list[str]:
    root = os.path.join(prefix, VERSIONS, vid)
    kept = []
    for rel, sha in sorted(entry.get("files", {}).items()):
        path = os.path.join(root, rel)
        if not os.path.lexists(path):
            continue
        if _file_sha(path) != sha:
            kept.append(path)
            continue
        done.lines.append(f"remove {path}")
        if not dry:
            os.unlink(path)
    if not dry:
        _rmdirs_under(root)
    return kept


def _rmdirs_under(root: str) -> None:
    """Remove ``root`` and the directories under it that are empty (deepest first)."""
    if not os.path.isdir(root):
        return
    for d, _, _ in sorted(os.walk(root), key=lambda t: -t[0].count(os.sep)):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def _config(inp: Inputs, manifest: dict[str, Any], done: Done, write: bool, dry: bool) -> None:
    """The example config, only where none exists; mode 0600 (it may come to hold webhook secrets)."""
    if not write or os.path.lexists(inp.config):
        return
    text = example_config()
    done.lines.append(f"write {inp.config} (the example config, mode 0600)")
    created = manifest["dirs"]
    _makedirs(os.path.dirname(os.path.abspath(inp.config)), created, dry)
    if not dry:
        fsutil.atomic_write(inp.config, text, mode=0o600)
    manifest["config"] = {"path": os.path.abspath(inp.config), "sha256": _sha(text)}


def _write_manifest(prefix: str, manifest: dict[str, Any], old: dict[str, Any] | None, dry: bool) -> None:
    if manifest == old or dry:
        return
    fsutil.atomic_write(os.path.join(prefix, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n",
                        mode=0o644)


def uninstall(prefix: str, *, dry: bool = False) -> Done:
    """Remove exactly what installs laid under ``prefix`` (and the example config, if unchanged)."""
    prefix = os.path.abspath(prefix)
    manifest = load_manifest(prefix)
    if manifest is None:
        raise InstallError(f"{os.path.join(prefix, MANIFEST)} not found: nothing laid by `slurm-hooks install` here")
    done = Done(version_id=manifest.get("current") or "")
    for rel in manifest["links"]:
        path = os.path.join(prefix, rel)
        if os.path.islink(path) and os.readlink(path) == _link_target(prefix, rel):
            done.lines.append(f"remove {path}")
            if not dry:
                os.unlink(path)
        elif os.path.lexists(path):
            done.kept.append(path)
    cur = os.path.join(prefix, CURRENT)
    if os.path.islink(cur) and os.readlink(cur).startswith(VERSIONS + "/"):
        done.lines.append(f"remove {cur}")
        if not dry:
            os.unlink(cur)
    for vid, entry in sorted(manifest["versions"].items()):
        done.kept += _remove_version(prefix, vid, entry, done, dry)
    cfg = manifest.get("config")
    if cfg:
        if _file_sha(cfg["path"]) == cfg["sha256"]:
            done.lines.append(f"remove {cfg['path']} (the example config, unchanged)")
            if not dry:
                os.unlink(cfg["path"])
                with contextlib.suppress(FileNotFoundError):  # the hooks' parsed copy of it
                    os.unlink(confcache.cache_path(cfg["path"]))
        elif os.path.lexists(cfg["path"]):
            done.kept.append(cfg["path"])
    done.lines.append(f"remove {os.path.join(prefix, MANIFEST)}")
    if not dry:
        os.unlink(os.path.join(prefix, MANIFEST))
        for d in sorted(manifest["dirs"], key=lambda p: -p.count(os.sep)):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(prefix, VERSIONS))  # made by an install; empty once its versions are gone
    return done

"""A receiver's URL is a credential: a Slack incoming-webhook URL is all it takes to post to the
channel. Read it from where the config says (``url_file``, ``url_env``, or ``url``), and print
only its scheme and host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from slurm_hooks.errors import ConfigError
from slurm_hooks.values import compile_later

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

#: What a receiver's URL must look like.
URL = compile_later(r"^https?://[^/\s]+")


def url_origin(url: str) -> str:
    """What may be printed of a URL: its scheme and host (the path and query of a webhook are the secret).
    Without a scheme, a host only where one is plain to see (``hooks.slack.com/...``): a token pasted
    alone (``xoxb-...``, a JWT) has no part that may be shown, and gives ""."""
    scheme, sep, rest = (url or "").partition("://")
    if not sep:
        head, slash, _ = (url or "").partition("/")
        return head[:100] if slash and HOST.match(head) else ""
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme[:10]}{sep}{host[:100]}"


#: A host name (dotted) with an optional port: what a URL without its scheme may show.
HOST = compile_later(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:\d+)?$")


def bad_url(url: str) -> str:
    shown = url_origin(url)
    if not shown:
        return "must be an http:// or https:// URL (its content is not shown: a webhook URL is a secret)"
    return f"must be an http:// or https:// URL, got {shown!r}... (the rest is not shown: a webhook URL is a secret)"


def holds_secret(table: dict[str, Any]) -> bool:
    """A ``[[notify.*]]`` table with its URL written in the config file itself."""
    return bool(table.get("url"))


def resolve_url(table: dict[str, Any], label: str, environ: Mapping[str, str] | None = None) -> str:
    """The URL of a ``[[notify.*]]`` table, read from where it says; :class:`ConfigError` names the file
    or the variable, never the URL."""
    environ = os.environ if environ is None else environ
    if table.get("url"):
        url, where = table["url"], f"{label} url"
    elif table.get("url_env"):
        url, where = environ.get(table["url_env"], "").strip(), f"{label} url_env ${table['url_env']}"
        if not url:
            raise ConfigError(f"{where}: the variable is not set or empty")
    else:
        path = table.get("url_file", "")
        try:
            with open(path, encoding="utf-8") as fh:
                url = fh.read(8192).strip()
        except OSError as exc:
            raise ConfigError(f"{label} url_file: cannot read: {exc.strerror}", path) from None
        where = f"{label} url_file {path}"
        if not url:
            raise ConfigError(f"{where}: the file is empty")
    flaw = _flaw(url)
    if flaw:
        raise ConfigError(f"{where}: {flaw}; it must hold the URL alone, on one line (its content is not shown: "
                          "a webhook URL is a secret)")
    if not URL.match(url):
        raise ConfigError(f"{where}: {bad_url(url)}")
    return url


def _flaw(url: str) -> str:
    """What makes ``url`` (already stripped) something urllib would refuse, said without it: a second
    line (``http.client.InvalidURL`` at every send), a control character, a space."""
    lines = len(url.splitlines())
    if lines > 1:
        return f"it holds {lines} lines"
    for n, ch in enumerate(url):
        if ord(ch) < 32 or ord(ch) == 127:
            return f"it holds a control character (code {ord(ch)}) at character {n + 1}"
        if ch.isspace():
            return f"it holds a space at character {n + 1}"
    return ""

"""The end of ``isolate`` and ``sweep``: run the search or the sweep, say its summary, exit by it."""

from __future__ import annotations

import json

import click

from slurm_hooks.errors import EXIT_OK, EXIT_UNAVAILABLE, EXIT_UNHEALTHY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def run_and_say(name: str, run: Callable[[], Any], busy: type[Exception], undone: str, as_json: bool,
                then: Callable[[Any], None] | None = None, code: Callable[[Any], int] | None = None) -> int:
    """``run()``'s summary said (its line, or its JSON with ``--json``); ``then(summary)`` after it.

    Exit ``code(summary)`` where given, else 0 when the summary is ok, 1 when not; 3 when ``busy``
    says another run holds the nodes; 130 when interrupted (``undone``: what the run undid on its way out).
    """
    try:
        summary = run()
    except busy as exc:
        click.echo(f"slurm-hooks {name}: {exc}", err=True)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        click.echo(f"slurm-hooks {name}: interrupted: {undone}", err=True)
        return 130
    click.echo(json.dumps(summary.to_dict()) if as_json else summary.line())
    if then is not None:
        then(summary)
    if code is not None:
        return code(summary)
    return EXIT_OK if summary.ok else EXIT_UNHEALTHY

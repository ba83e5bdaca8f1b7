"""``[[notify.webhook]]`` and ``[[notify.alertmanager]]``: one class per receiver's table, one field
per key, as the config's sections (:mod:`slurm_hooks.config`, which imports this module only for a
file that has such a table: a node's health check without receivers makes none of these classes)."""

from __future__ import annotations

from slurm_hooks.values import dataclass, setting


@dataclass(frozen=True)
class _Receiver:
    """``[[notify.<kind>]]``: exactly one of ``url``, ``url_file`` or ``url_env`` says where its URL is (the
    URL is a credential: a Slack webhook URL is all it takes to post)."""

    url: str = setting("", doc="the URL itself (then the config must be 0600)")
    url_file: str = setting("", doc="a 0600 file holding the URL (or url_env, or url)",
                            example="/etc/slurm-hooks/receiver.url")
    url_env: str = setting("", doc="an environment variable holding the URL")
    name: str = setting("", doc="optional, names the receiver in logs", example="oncall")


@dataclass(frozen=True)
class WebhookTable(_Receiver):
    format: str = setting("json", example="slack",
                          doc='"slack" (incoming webhook) or "json" (the incident as a JSON object)')


@dataclass(frozen=True)
class AlertmanagerTable(_Receiver):
    auth_file: str = setting("", example="/etc/slurm-hooks/alertmanager.auth",
                             doc='optional: a file holding the Authorization header\'s value ("Bearer ...", "Basic ...") '
                                 'or a bare token (sent as Bearer)')


#: ``[[notify.<kind>]]`` -> its table's class.
TABLES = {"webhook": WebhookTable, "alertmanager": AlertmanagerTable}

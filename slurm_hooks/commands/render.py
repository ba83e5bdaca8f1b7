"""``slurm-hooks render``: install artefacts for Kubernetes and Slinky, from templates.

- ``rbac.yaml``: ServiceAccount, ClusterRole with exactly the bridge's verbs
  (plus the replacement backend's), ClusterRoleBinding;
- ``bridge.yaml``: the bridge's config as a ConfigMap and its Deployment;
- ``slinky-values.yaml``: values for the Slinky ``slurm`` chart: prolog and
  epilog scripts, HealthCheckProgram in ``controller.extraConf``, the slurmd
  volume mounts, and the node-side config (a Secret: a webhook URL is a credential);
- ``alertmanager.yaml`` (``render alertmanager``): a route grouping slurm-hooks'
  alerts by ``alertname`` and ``cluster``, for the fleet's Alertmanager.

Files written with ``--out`` are 0600: they can hold credentials.
"""

from __future__ import annotations

import os
from importlib import resources

import click

from slurm_hooks import __version__
from slurm_hooks import config as config_mod
from slurm_hooks.errors import ConfigError
from slurm_hooks.install import layout

FILES = {"rbac": "rbac.yaml", "bridge": "bridge.yaml", "slinky": "slinky-values.yaml",
         "alertmanager": "alertmanager.yaml"}
#: What ``render`` writes when nothing is named (Alertmanager's route only on demand).
DEFAULT = ("rbac", "bridge", "slinky")

_NODE_CONFIG = """\
# slurm-hooks on the slurmd pods (HealthCheckProgram, Prolog, Epilog).
[gpu]
backend = "nvml"

[log]
audit = "/var/log/slurm-hooks/audit.jsonl"

[state]
dir = "/var/lib/slurm-hooks/state"
"""


def _bridge_config(slinky_namespace: str, backend: str) -> str:
    return f"""\
# slurm-hooks bridge (rendered by `slurm-hooks render`; see conf/bridge.example.toml for every key).
[log]
audit = "/var/lib/slurm-hooks/audit.jsonl"

[slurm]
backend = "scontrol"

[bridge]
mapping = "slinky"
slinky_namespace = "{slinky_namespace}"
state_file = "/var/lib/slurm-hooks/bridge-state.json"

[bridge.replace]
backend = "{backend}"
"""


def _roles(all_rules, namespace: str) -> list[dict]:
    """The namespaced rules as one Role per namespace (the Lease's, the Events'), the bridge's own first."""
    by_ns: dict[str, list] = {}
    for rule in all_rules:
        if rule.namespaced:
            by_ns.setdefault(rule.namespace or namespace, []).append(rule)
    order = sorted(by_ns, key=lambda ns: (ns != namespace, ns))
    return [{"namespace": ns, "rules": by_ns[ns]} for ns in order]


def _template(name: str) -> str:
    return resources.files("slurm_hooks").joinpath("templates", "k8s", name).read_text(encoding="utf-8")


def render_all(
    *,
    namespace: str = "slurm-hooks",
    image: str = f"slurm-hooks-bridge:{__version__}",
    sackd_image: str = "ghcr.io/slinkyproject/sackd:25.11-ubuntu24.04",
    controller: str = "slurm-controller.slurm:6817",
    slurm_key_secret: str = "slurm-auth-slurm",
    slinky_namespace: str = "slurm",
    release: str = "slurm",
    nodeset: str = "slinky",
    prefix: str = layout.DEFAULT_PREFIX,
    health_check_interval: int = 300,
    config_text: str | None = None,
    node_config_text: str | None = None,
    template_group: str = "",
    am_receiver: str = "gpu-oncall",
    am_webhook_url: str = "",
    am_group_wait: str = "30s",
    am_group_interval: str = "5m",
) -> dict[str, str]:
    """name -> YAML text. ``config_text`` (a bridge config.toml) sets the backend and is embedded."""
    import jinja2

    from slurm_hooks.bridge import rbac
    from slurm_hooks.bridge import settings as settings_mod

    if config_text is None:
        config_text = _bridge_config(slinky_namespace, "condition")
    cfg = config_mod.parse(config_text, "<bridge config>")
    settings = settings_mod.from_config(cfg)
    _no_inline_url(cfg)
    from slurm_hooks.bridge.replace import ReplacementError, template_groups

    try:
        groups = template_groups(settings.replace, settings.reboot)
    except ReplacementError as exc:
        raise ConfigError(str(exc)) from None
    if template_group:  # an explicit --template-group wins for the replacement backend
        groups["replace"] = template_group
    all_rules = rbac.rules(settings, groups)
    name = "slurm-hooks-bridge"
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "slurm-hooks"}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    ctx = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "selector": {"app.kubernetes.io/name": name},
        "backend": settings.replace.backend,
        "rules": [r for r in all_rules if not r.namespaced],
        "roles": _roles(all_rules, namespace),
        "lease_namespace": settings.lease_namespace or namespace,
        "lease_name": settings.lease_name,
        "state_storage": "1Gi",
        "replicas": 2 if settings.leader_election else 1,
        "leader_election": settings.leader_election,
        "image": image,
        "sackd_image": sackd_image,
        "controller": controller,
        "slurm_key_secret": slurm_key_secret,
        "config_toml": config_text.rstrip("\n"),
        "node_config_toml": (node_config_text or _NODE_CONFIG).rstrip("\n"),
        "release": release,
        "nodeset": nodeset,
        "programs": {p.hook: layout.program_path(p.hook, prefix) for p in layout.PROGRAMS},
        "install_command": layout.install_command(prefix),
        "health_check_interval": health_check_interval,
        "am_receiver": am_receiver,
        "am_webhook_url": am_webhook_url,
        "am_group_wait": am_group_wait,
        "am_group_interval": am_group_interval,
    }
    return {key: env.from_string(_template(f"{filename}.j2")).render(**ctx) for key, filename in FILES.items()}


def _no_inline_url(cfg: config_mod.Config) -> None:
    """The bridge's config goes into a ConfigMap, which anyone who may read the namespace reads: a
    receiver URL (a credential) written in it is refused; ``url_env`` or ``url_file`` from a Secret."""
    from slurm_hooks.urlsecret import holds_secret

    for kind in config_mod.DESTINATION_KEYS:
        for n, table in enumerate(getattr(cfg.notify, kind)):
            if holds_secret(table):
                raise ConfigError(f"[[notify.{kind}]] #{n + 1} url: the bridge's config is rendered into a "
                                  "ConfigMap, and a receiver URL is a credential: give it with url_env (from a "
                                  "Secret) or url_file (a mounted Secret)", cfg.path)


def _read(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path) from None


@click.command()
@click.argument("what", nargs=-1, type=click.Choice(sorted(FILES)))
@click.option("--out", "out_dir", metavar="DIR",
              help="Write rbac.yaml, bridge.yaml, slinky-values.yaml here, mode 0600 (default: stdout).")
@click.option("--only", type=click.Choice(sorted(FILES)), multiple=True, help="Render only these (repeatable).")
@click.option("--config", "config_path", metavar="PATH", help="The bridge's config.toml to embed (sets the backend).")
@click.option("--node-config", "node_config_path", metavar="PATH", help="The slurmd-side config.toml to embed in the Slinky values.")
@click.option("--namespace", default="slurm-hooks", show_default=True, help="Namespace of the bridge.")
@click.option("--image", default=f"slurm-hooks-bridge:{__version__}", show_default=True, help="Bridge image (slurm-hooks[k8s] and scontrol in it).")
@click.option("--sackd-image", default="ghcr.io/slinkyproject/sackd:25.11-ubuntu24.04", show_default=True)
@click.option("--controller", default="slurm-controller.slurm:6817", show_default=True, help="slurmctld host:port for configless sackd.")
@click.option("--slurm-key-secret", default="slurm-auth-slurm", show_default=True, help="Secret holding slurm.key.")
@click.option("--slinky-namespace", default="slurm", show_default=True, help="Where the slurmd pods run.")
@click.option("--release", default="slurm", show_default=True, help="Slinky Helm release name (for the helm command).")
@click.option("--nodeset", default="slinky", show_default=True, help="Slinky NodeSet to mount slurm-hooks into.")
@click.option("--prefix", default=layout.DEFAULT_PREFIX, show_default=True, metavar="DIR",
              help="Where `slurm-hooks install` laid the programs in the slurmd image.")
@click.option("--health-check-interval", type=click.IntRange(1), default=300, show_default=True, metavar="SECONDS")
@click.option("--template-group", default="", help="API group of the resource for backend \"template\".")
@click.option("--am-receiver", default="gpu-oncall", show_default=True, help="Alertmanager: the receiver's name.")
@click.option("--am-webhook-url", default="", metavar="URL", help="Alertmanager: a webhook receiver (else fill in yours).")
@click.option("--am-group-wait", default="30s", show_default=True, help="Alertmanager: how long a group gathers.")
@click.option("--am-group-interval", default="5m", show_default=True, help="Alertmanager: wait before telling a group's changes.")
def render(what, out_dir, only, config_path, node_config_path, namespace, image, sackd_image, controller,
           slurm_key_secret, slinky_namespace, release, nodeset, prefix, health_check_interval, template_group,
           am_receiver, am_webhook_url, am_group_wait, am_group_interval) -> None:
    """Render the bridge's RBAC and Deployment, Helm values wiring slurm-hooks into Slinky, and (named:
    `render alertmanager`) an Alertmanager route grouping our alerts by alertname and cluster."""
    config_text = _read(config_path)
    if config_path:
        from slurm_hooks.bridge import settings as settings_mod

        settings_mod.from_config(config_mod.load(config_path))  # file:line errors before anything is written
    docs = render_all(
        namespace=namespace, image=image, sackd_image=sackd_image, controller=controller,
        slurm_key_secret=slurm_key_secret, slinky_namespace=slinky_namespace, release=release, nodeset=nodeset,
        prefix=prefix, health_check_interval=health_check_interval, config_text=config_text,
        node_config_text=_read(node_config_path), template_group=template_group, am_receiver=am_receiver,
        am_webhook_url=am_webhook_url, am_group_wait=am_group_wait, am_group_interval=am_group_interval,
    )
    wanted = list(dict.fromkeys([*what, *only])) or list(DEFAULT)
    if out_dir:
        from slurm_hooks import fsutil

        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        for key in wanted:
            path = os.path.join(out_dir, FILES[key])
            fsutil.atomic_write(path, docs[key], mode=0o600)
            click.echo(path)
        return
    click.echo("\n---\n".join(f"# {FILES[key]}\n{docs[key].rstrip()}" for key in wanted))

"""The Kubernetes bridge: Slurm node state in, cordon / drain / replacement out.

Layers, pointing one way::

    commands.bridge -> bridge.reconciler -> bridge.{breaker, mapping, drain, replace, state}
                                          -> bridge.api (KubeApi protocol, errors, plain dicts)
    bridge.kubeclient implements bridge.api with the official ``kubernetes`` client

Only :mod:`slurm_hooks.bridge.kubeclient` imports ``kubernetes`` (lazily, ~0.35 s);
the logic sees Kubernetes objects as plain dicts through :class:`~.api.KubeApi`,
so unit tests hand it an in-memory implementation and contract tests hand it the
real client pointed at the kmock HTTP emulator.
"""

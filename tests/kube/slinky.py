"""A test double of the Slinky slurm-operator, for the bridge's end-to-end tests.

What it does is what the operator's source does to Slurm (slurm-operator, ``worker_app.go``
and the NodeSet controller), against the real testbed slurmctld, with kmock as the API server:

- **the preStop**: when the slurmd pod of a NodeSet is evicted, the kubelet runs the pod's
  preStop hook, the real command ``scontrol update nodename=$(hostname) state=down
  reason='slurm-operator: Pod is terminating'`` (``$(hostname)`` is the pod's hostname, the
  Slurm node's name), then deletes the pod. Other evicted pods are deleted after a short
  grace. The emulator runs with ``graceful = True``, so an evicted pod is terminating (same
  UID, ``deletionTimestamp``) until this double, as the kubelet, deletes it;
- **the reason rule** (``IsNodeReasonOurs``): the operator owns exactly the reasons that start
  with ``slurm-operator: ``. A cordoned Kubernetes node makes it drain the Slurm node under it
  with its own reason only if nobody else drained it; it undrains only its own reasons;
- **the Comment**: the Slurm node's ``Comment`` is the operator's JSON naming the pod and the
  Kubernetes node it runs on; :meth:`reschedule` moves the NodeSet's pod to another Kubernetes
  node (a new pod, a new UID), rewrites the Comment, and undrains the node (its reason is the
  operator's after the preStop).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
from typing import Any

from .doubles import controlled_by
from .emulator import KubeServer, pod

PRESTOP = "scontrol update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating'"
OPERATOR_PREFIX = "slurm-operator: "
HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"


def is_reason_ours(reason: str) -> bool:
    """The operator's ``IsNodeReasonOurs``."""
    return (reason or "").startswith(OPERATOR_PREFIX)


class SlinkyOperator:
    def __init__(self, server: KubeServer, testbed: Any, namespace: str = "slurm", nodeset: str = "slinky",
                 grace: float = 0.3):
        self.server = server
        self.tb = testbed
        self.namespace = namespace
        self.nodeset = nodeset
        self.grace = grace
        #: (Slurm node, the preStop's exit status, its stderr) for every preStop run.
        self.prestops: list[tuple[str, int, str]] = []
        self._work: queue.Queue[tuple[str, str, dict] | None] = queue.Queue()
        self._bin = tempfile.mkdtemp(prefix="slinky-double-")
        self._thread = threading.Thread(target=self._kubelet, name="slinky-kubelet", daemon=True)
        self._generation = 0
        server.kmock.graceful = True
        server.kmock.on_evict.append(lambda ns, name, obj: self._work.put((ns, name, obj)))
        self._thread.start()

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(15)
        self.server.kmock.graceful = False
        self.server.kmock.on_evict.clear()

    # -- the NodeSet's pods ----------------------------------------------------------------------

    def pod_name(self, slurm_node: str) -> str:
        return f"{self.nodeset}-{slurm_node}"

    def place(self, slurm_node: str, kube_node: str) -> dict:
        """The NodeSet's slurmd pod for ``slurm_node`` running on ``kube_node``; the Comment follows."""
        self._generation += 1
        body = pod(self.pod_name(slurm_node), kube_node, self.namespace, **controlled_by(
            "NodeSet", self.nodeset, labels={HOSTNAME_LABEL: slurm_node}))
        body["metadata"]["uid"] = f"uid-{self.pod_name(slurm_node)}-{self._generation}"
        self.server.put("v1/pods", body, self.namespace)
        comment = json.dumps({"namespace": self.namespace, "podName": self.pod_name(slurm_node), "node": kube_node},
                             separators=(",", ":"))
        self.tb.scontrol("update", f"NodeName={slurm_node}", f"Comment={comment}")
        return body

    def reschedule(self, slurm_node: str, kube_node: str) -> dict:
        """The NodeSet controller recreates the pod on ``kube_node``; slurmd registers, and the
        operator undrains the node if (and only if) its reason is the operator's."""
        body = self.place(slurm_node, kube_node)
        info = self.tb.slurm.node(slurm_node)
        if info.drained or "DOWN" in info.flags:
            if is_reason_ours(info.reason) or not info.reason:
                self.tb.scontrol("update", f"NodeName={slurm_node}", "State=RESUME")
        return body

    def sync_cordons(self) -> list[str]:
        """The operator's cordon rule: a slurmd pod on a cordoned Kubernetes node drains its Slurm node
        with the operator's reason, unless the node is already drained (by anyone: not its reason to
        replace). Returns the Slurm nodes it drained."""
        drained = []
        for p in self.server.list("v1/pods", self.namespace):
            slurm_node = (p["metadata"].get("labels") or {}).get(HOSTNAME_LABEL)
            kube = self.server.get("v1/nodes", p["spec"]["nodeName"])
            if not slurm_node or kube is None or not (kube.get("spec") or {}).get("unschedulable"):
                continue
            info = self.tb.slurm.node(slurm_node)
            if not info.drained:
                self.tb.scontrol("update", f"NodeName={slurm_node}", "State=DRAIN",
                                 "Reason=slurm-operator: node is cordoned")
                drained.append(slurm_node)
        return drained

    # -- the kubelet -------------------------------------------------------------------------------

    def _kubelet(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            namespace, name, obj = item
            hostname = (obj["metadata"].get("labels") or {}).get(HOSTNAME_LABEL)
            if hostname:
                self._prestop(hostname)
            else:
                threading.Event().wait(self.grace)  # the pod's own shutdown
            self.server.finish(name, namespace)

    def _prestop(self, hostname: str) -> None:
        """Run the preStop command as the container would: ``sh -c`` with ``hostname`` the pod's."""
        shim = os.path.join(self._bin, "hostname")
        with open(shim, "w", encoding="utf-8") as fh:
            fh.write(f"#!/bin/sh\necho {hostname}\n")
        os.chmod(shim, 0o755)
        env = {**self.tb.env, "PATH": f"{self._bin}:{self.tb.env.get('PATH', os.environ.get('PATH', ''))}"}
        done = subprocess.run(["/bin/sh", "-c", PRESTOP], env=env, capture_output=True, text=True, timeout=30)
        self.prestops.append((hostname, done.returncode, done.stderr.strip()))

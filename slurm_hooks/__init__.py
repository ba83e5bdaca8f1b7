"""slurm-hooks: GPU health checks, drain and requeue for Slurm, and a Kubernetes bridge."""

__version__ = "0.1.0"

#: Every drain reason we write starts with this; we only ever resume nodes that carry it.
REASON_PREFIX = "slurm-hooks:"

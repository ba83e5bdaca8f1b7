"""The lab: a real local Slurm cluster (testbed, with accounting), the demo and the
example training job's helpers. Admin and developer tooling; nothing on the node's
runtime path imports it (an import-linter contract says so)."""

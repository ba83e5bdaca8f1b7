"""``slurm-hooks install``: the one install path (layout), and laying it under a prefix (apply)."""

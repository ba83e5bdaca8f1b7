"""What the hooks do to a node (the repair ladder); :mod:`slurm_hooks.hooks` keeps when they do it."""

"""What runs on a node, and when: the health check, prolog, epilog, watcher, sweep and isolate.

What they do to a node lives in :mod:`slurm_hooks.remedy`.
"""

"""What the hooks do to a node: drain, requeue, follow, hold and let go, repair.

:mod:`slurm_hooks.hooks` keeps *when* (the health check, prolog and epilog, watcher, sweep and
isolate); this package keeps *what*: :mod:`.wiring` (the collaborators a hook is handed),
:mod:`.drain` (drain, resume), :mod:`.requeue` (the jobs a fault touches), :mod:`.outcome` (what a
run did), :mod:`.ownership` (the drain marker: is a drain still ours; hold, let go, find it again),
:mod:`.follower` and :mod:`.checkpoint` (a touched job through to running elsewhere),
:mod:`.gpumap` (one GPU, one identity), :mod:`.pending` (what could not finish), :mod:`.audit` (one
record per step), :mod:`.culprit` and :mod:`.suspect` (the node behind a failed multi-node job) and
:mod:`.repair` (the ladder).
"""

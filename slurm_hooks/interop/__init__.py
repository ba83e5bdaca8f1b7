"""Other programs' contracts that slurm-hooks speaks, each in its own module, written from the
published contract (never a copy of the other side's generated code), its libraries imported
only when the contract is used.

- :mod:`.nvhcd`: the node-health service NVIDIA Resiliency Extension's ``ft_launcher`` asks
  before each rendezvous (gRPC over a Unix socket).
"""

"""How a job heals itself, as its comment, environment, script or command line say (pure parsing).

Frameworks that keep a job alive inside its allocation (docs/checkpoint.md, "Jobs that heal
themselves"), and what marks each:

- ``nvrx``: NVIDIA Resiliency Extension's ``ft_launcher`` (restarts ranks in place, on the
  allocation's spare nodes); seen as ``ft_launcher`` in the script or a process's command line.
- ``torchrun``: torchrun with elastic membership, ``--nnodes=MIN:MAX`` (MIN < MAX) and
  ``--max-restarts`` above 0: it goes on without a node; fixed ``--nnodes`` waits for all of them.
- ``megatron``: Megatron-LM, whose exit 16/17 name a suspect GPU; seen as ``megatron`` or
  ``pretrain_<model>.py`` in the script or command line.
- ``lightning``: PyTorch Lightning's SLURM auto-requeue (its SIGUSR1 saves, rank 0 requeues).
- ``in-place``: any other job that continues without a node once its ranks there are gone.

A user declares them in the job's ``--comment`` (``heals=nvrx,megatron``: a word of the comment)
or its environment (``SLURM_HOOKS_HEALS=nvrx``, read only while a process of the job runs on the
node); a declaration wins over what is seen. Nothing read here reaches a command line.
"""

from __future__ import annotations

import enum
import re

from slurm_hooks.values import dataclass

#: The environment key a job declares its frameworks with.
ENV_KEY = "SLURM_HOOKS_HEALS"
#: The word of ``--comment`` that does (``heals=<framework>[,<framework>...]``).
COMMENT_KEY = "heals"


class Heals(str, enum.Enum):
    NVRX = "nvrx"
    TORCHRUN = "torchrun"
    MEGATRON = "megatron"
    LIGHTNING = "lightning"
    IN_PLACE = "in-place"


#: Those that go on without a node whose ranks are gone.
IN_PLACE = frozenset({Heals.NVRX, Heals.TORCHRUN, Heals.IN_PLACE})

_COMMENT = re.compile(rf"(?:^|[\s;]){COMMENT_KEY}=([A-Za-z,\-]+)")
_FT_LAUNCHER = re.compile(r"(?:^|[\s/])ft_launcher(?:\s|$)", re.M)
_TORCHRUN = re.compile(r"(?:^|[\s/.])(?:torchrun(?:\.py)?|torch\.distributed\.run)(?=\s|$)(?P<args>[^\n]*)", re.M)
_NNODES = re.compile(r"--nnodes[= ](\d+):(\d+)")
_RESTARTS = re.compile(r"--max[-_]restarts[= ](\d+)")
_MEGATRON = re.compile(r"(?:\bmegatron\b|\bpretrain_[a-z0-9]+\.py\b)", re.I)


@dataclass(frozen=True)
class Marks:
    """What a job says of itself: its frameworks and where that was read ("" when nowhere)."""

    heals: frozenset = frozenset()
    source: str = ""

    @property
    def in_place(self) -> bool:
        return bool(self.heals & IN_PLACE)

    def __contains__(self, item: object) -> bool:
        return item in self.heals

    @property
    def spec(self) -> str:
        """``nvrx,megatron``: as a declaration writes it (sorted)."""
        return ",".join(sorted(h.value for h in self.heals))


NONE = Marks()


def parse_declared(text: str | None) -> frozenset:
    """``nvrx,megatron`` -> the frameworks named; unknown words are left out."""
    out = set()
    for word in (text or "").lower().split(","):
        try:
            out.add(Heals(word.strip()))
        except ValueError:
            continue
    return frozenset(out)


def from_comment(comment: str | None) -> frozenset:
    """The ``heals=...`` word of a job's ``--comment``."""
    m = _COMMENT.search(comment or "")
    return parse_declared(m.group(1)) if m else frozenset()


def from_text(text: str | bytes | None) -> frozenset:
    """What a batch script or a command line shows of the frameworks (``#SBATCH`` lines and
    comments count as well: a script that names ft_launcher in a comment is taken at its word)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not text:
        return frozenset()
    found = set()
    if _FT_LAUNCHER.search(text):
        found.add(Heals.NVRX)
    for m in _TORCHRUN.finditer(text):
        if elastic(m.group("args")):
            found.add(Heals.TORCHRUN)
    if _MEGATRON.search(text):
        found.add(Heals.MEGATRON)
    return frozenset(found)


def elastic(args: str) -> bool:
    """torchrun's arguments say it goes on without a node: ``--nnodes=MIN:MAX`` with MIN < MAX and
    ``--max-restarts`` above 0."""
    nodes, restarts = _NNODES.search(args), _RESTARTS.search(args)
    return bool(nodes and restarts and int(nodes.group(1)) < int(nodes.group(2)) and int(restarts.group(1)) > 0)

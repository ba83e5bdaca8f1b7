"""A job's own checkpoint signal (``--signal=[{R|B}:]SIG[@TIME]``), read where Slurm leaves it.

Slurm keeps ``warn_signal``/``warn_time``/``warn_flags`` only in the submit request:
``scontrol show job``, ``squeue -O`` and pyslurm's ``Job`` do not show them. What is
left to read: the batch script's ``#SBATCH --signal=...`` lines, ``SBATCH_SIGNAL`` in
the job's environment, and the submit line (``SubmitLine`` in ``scontrol show job`` from
25.11, else ``sacct -o SubmitLine``). sbatch's own order decides between them: the command
line over the environment over the script.

Everything here is a pure function of text a user wrote: a script is data, read
only up to :data:`SCRIPT_MAX_BYTES` and only in its leading ``#SBATCH`` block, and a
signal is accepted only by name from :data:`CHECKPOINT_SIGNALS`.
"""

from __future__ import annotations

import enum
import shlex

from slurm_hooks.values import compile_later, dataclass

#: How much of a batch script is read: sbatch stops at the first command, and the
#: ``#SBATCH`` block is at the top; a 4 MB script costs no more than its first 64 KiB.
SCRIPT_MAX_BYTES = 64 * 1024
#: A submit line longer than this is not parsed (sacct prints the whole argv).
SUBMIT_LINE_MAX = 16 * 1024
#: sbatch's default ``@TIME`` when the spec has none.
DEFAULT_WARN_S = 60
#: sbatch's largest ``@TIME`` (warn_time is 16 bits).
MAX_WARN_S = 0xFFFF

#: Signals a job may ask for and we deliver as its checkpoint signal. KILL and STOP
#: cannot be caught: sending them "first" would only end or freeze the job early.
CHECKPOINT_SIGNALS = {
    "HUP": 1, "INT": 2, "QUIT": 3, "USR1": 10, "USR2": 12, "ALRM": 14, "TERM": 15, "CONT": 18,
    "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "PWR": 30,
}
_BY_NUMBER = {num: name for name, num in CHECKPOINT_SIGNALS.items()}

_SPEC = compile_later(r"^(?:(?P<flags>RB|BR|R|B):)?(?P<sig>[A-Za-z0-9+]{1,10})(?:@(?P<time>[0-9]{1,6}))?$")
_SBATCH_LINE = compile_later(rb"^#SBATCH\s+(.*)$")


class Target(str, enum.Enum):
    """Where Slurm sends the signal: every step (no flag), or only the batch shell (``B:``)."""

    STEPS = "steps"
    BATCH = "batch"


class Source(str, enum.Enum):
    SUBMIT_LINE = "submit-line"
    ENVIRONMENT = "environment"
    SCRIPT = "script"
    POLICY = "policy"
    #: The job's framework's own default (Lightning: SIGUSR1), for a job marked with it.
    FRAMEWORK = "framework"


@dataclass(frozen=True)
class JobSignal:
    """What the job asked for: signal ``name`` (``USR1``), ``warn_s`` before its end, to ``target``."""

    name: str
    warn_s: int = DEFAULT_WARN_S
    target: Target = Target.STEPS
    #: ``R:``: the job may be signalled ahead of a reservation's end too (no effect on delivery).
    reservation: bool = False
    source: Source = Source.SCRIPT

    @property
    def spec(self) -> str:
        """The spec in sbatch's own words: ``B:USR1@90``."""
        flags = ("R" if self.reservation else "") + ("B" if self.target is Target.BATCH else "")
        return f"{flags + ':' if flags else ''}{self.name}@{self.warn_s}"


def signal_name(text: str) -> str:
    """``USR1`` for ``USR1``, ``SIGUSR1``, ``sigusr1`` or ``10``; ValueError for anything not in
    :data:`CHECKPOINT_SIGNALS`."""
    word = text.strip().upper()
    if word.isdigit():
        name = _BY_NUMBER.get(int(word))
        if name is None:
            raise ValueError(f"signal {text!r} is not one a job can checkpoint on")
        return name
    word = word[3:] if word.startswith("SIG") else word
    if word not in CHECKPOINT_SIGNALS:
        raise ValueError(f"signal {text!r} is not one a job can checkpoint on "
                         f"(known: {', '.join(sorted(CHECKPOINT_SIGNALS))})")
    return word


def parse_spec(text: str, source: Source = Source.SCRIPT) -> JobSignal:
    """``[{R|B}:]SIG[@TIME]`` as sbatch reads it; ValueError naming what is wrong."""
    m = _SPEC.match(text.strip())
    if not m:
        raise ValueError(f"not a --signal spec ([{{R|B}}:]SIG[@TIME]): {text[:80]!r}")
    warn = int(m.group("time")) if m.group("time") is not None else DEFAULT_WARN_S
    if warn > MAX_WARN_S:
        raise ValueError(f"--signal time {warn} is over {MAX_WARN_S}")
    flags = (m.group("flags") or "").upper()
    return JobSignal(signal_name(m.group("sig")), warn, Target.BATCH if "B" in flags else Target.STEPS,
                     "R" in flags, source)


#: sbatch's short options that take a value (``-p gpu``, or ``-pgpu``); the others are flags.
_SHORT_WITH_VALUE = frozenset("aABbcCdDeFGiJLmMnNopqStwx")
#: sbatch's long options that take no value, or one only after ``=`` (optional_argument): any
#: other ``--name`` without ``=`` takes the next word as its value.
_LONG_FLAGS = frozenset("""
    contiguous exclusive get-user-env help hold ignore-pbs no-kill no-requeue nice
    overcommit oversubscribe parsable propagate quiet reboot requeue spread-job test-only usage use-min-nodes
    verbose version wait x11 exact
""".split())


def _options(args: list[str]) -> list[str]:
    """sbatch's own options of a command line: up to ``--`` or the script's name (its first operand,
    not an option's value); what follows belongs to the script (``job.sh --signal=TERM``)."""
    k = 0
    while k < len(args):
        arg = args[k]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return args[:k]
        if arg.startswith("--"):
            if "=" not in arg and arg[2:] not in _LONG_FLAGS:
                k += 1  # its value is the next word
        else:
            letters = arg[1:]
            for i, ch in enumerate(letters):
                if ch in _SHORT_WITH_VALUE:
                    if i == len(letters) - 1:
                        k += 1  # -p gpu: the value is the next word
                    break  # -pgpu: the rest of the word is the value
        k += 1
    return args


def from_args(args: list[str], source: Source) -> JobSignal | None:
    """The last ``--signal`` among sbatch options (``--signal=X`` or ``--signal X``), up to ``--``;
    one that does not parse is passed over (sbatch would have refused it)."""
    found: JobSignal | None = None
    k = 0
    while k < len(args):
        arg = args[k]
        if arg == "--":
            break
        value = None
        if arg.startswith("--signal="):
            value = arg[len("--signal="):]
        elif arg == "--signal" and k + 1 < len(args):
            k += 1
            value = args[k]
        if value is not None:
            try:
                found = parse_spec(value, source)
            except ValueError:
                pass
        k += 1
    return found


def from_script(data: bytes) -> JobSignal | None:
    """The ``--signal`` of a batch script's ``#SBATCH`` block (sbatch reads it up to the first
    command line); ``None`` when it has none. Only the first :data:`SCRIPT_MAX_BYTES` are read."""
    found: JobSignal | None = None
    for n, raw in enumerate(data[:SCRIPT_MAX_BYTES].splitlines()):
        line = raw.strip()
        if n == 0 and line.startswith(b"#!"):
            continue
        if not line or (line.startswith(b"#") and not line.startswith(b"#SBATCH")):
            continue
        m = _SBATCH_LINE.match(line)
        if not m:
            break  # the first command: sbatch reads no further
        text = m.group(1).split(b" #", 1)[0].decode("utf-8", "replace")
        try:
            words = shlex.split(text)
        except ValueError:
            continue
        found = from_args(words, Source.SCRIPT) or found
    return found


def from_environment(value: str | None) -> JobSignal | None:
    """``SBATCH_SIGNAL`` as sbatch reads it (one spec)."""
    if not value:
        return None
    try:
        return parse_spec(value, Source.ENVIRONMENT)
    except ValueError:
        return None


def from_submit_line(line: str) -> JobSignal | None:
    """The ``--signal`` of a submit line (``sbatch --signal=B:USR1@60 job.sh``: ``scontrol show job``'s
    ``SubmitLine`` on 25.11+, else ``sacct -o SubmitLine``): sbatch's options only, a ``--signal``
    after the script's name is the script's own argument."""
    if not line or len(line) > SUBMIT_LINE_MAX:
        return None
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    if not words or not words[0].rsplit("/", 1)[-1].startswith("sbatch"):
        return None
    return from_args(_options(words[1:]), Source.SUBMIT_LINE)


def environ_value(environ: bytes, key: str) -> str | None:
    """``key``'s value in a ``/proc/<pid>/environ`` blob (NUL-separated ``K=V``)."""
    prefix = key.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None

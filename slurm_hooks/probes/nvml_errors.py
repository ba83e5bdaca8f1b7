"""The one place NVML return codes become typed errors.

The probe decides per class what an error means for a field: ``NotSupported``
is a reason (the field stays ``None``), ``GpuLost`` ends the GPU's queries,
``ResetRequired`` marks the GPU, anything else is recorded as unreadable.
"""

from __future__ import annotations

import pynvml

from slurm_hooks.errors import ProbeError, TransientError


class NvmlError(ProbeError):
    """An NVML call failed; ``code`` is the NVML return code (None if not an NVMLError)."""

    #: What the failure means, in a few words, for one-line messages.
    what = "NVML call failed"

    def __init__(self, message: str, code: int | None = None):
        self.code = code
        super().__init__(message)


class GpuLost(NvmlError):
    what = "GPU is lost"


class ResetRequired(NvmlError):
    what = "GPU requires a reset"


class NotSupported(NvmlError):
    what = "not supported"


class NoPermission(NvmlError):
    what = "no permission"


class LibraryNotFound(NvmlError):
    what = "library libnvidia-ml.so.1 not found"


class DriverNotLoaded(NvmlError):
    what = "driver not loaded"


class NvmlFailure(NvmlError):
    """Any other NVML failure: uninitialised, unknown, corrupted infoROM, ..."""


class NvmlTimeout(NvmlFailure, TransientError):
    what = "NVML call timed out"


class InsufficientSize(NvmlFailure, TransientError):
    """A list (processes) grew between the binding's count call and its fill call: ask again."""

    what = "list changed while read"


_BY_CODE: dict[int, type[NvmlError]] = {
    pynvml.NVML_ERROR_GPU_IS_LOST: GpuLost,
    pynvml.NVML_ERROR_RESET_REQUIRED: ResetRequired,
    pynvml.NVML_ERROR_NOT_SUPPORTED: NotSupported,
    # A driver older than the binding lacks the entry point: same as unsupported.
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: NotSupported,
    pynvml.NVML_ERROR_NO_PERMISSION: NoPermission,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: LibraryNotFound,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: DriverNotLoaded,
    pynvml.NVML_ERROR_TIMEOUT: NvmlTimeout,
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE: InsufficientSize,
}

_MISMATCH = getattr(pynvml, "NVMLLibraryMismatchError", ())

_NAMES: dict[int, str] = {
    value: name for name, value in vars(pynvml).items() if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def code_of(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None) if isinstance(exc, pynvml.NVMLError) else None
    return value if isinstance(value, int) else None


def code_name(code: int | None) -> str:
    """``15`` -> ``NVML_ERROR_GPU_IS_LOST``; unknown codes keep their number."""
    if code is None:
        return "not an NVML error"
    return _NAMES.get(code, f"NVML_ERROR_{code}")


def classify(exc: BaseException) -> type[NvmlError]:
    """Map an exception raised by a pynvml call to one of the classes above."""
    if isinstance(exc, _MISMATCH):
        return NotSupported  # pynvml's unversioned call needs a newer driver: same as FUNCTION_NOT_FOUND
    code = code_of(exc)
    if code is None:
        return NvmlFailure
    return _BY_CODE.get(code, NvmlFailure)


def for_code(code: int, where: str) -> NvmlError:
    """The typed error for a return code NVML gives inside a successful call's answer (a field
    value's own ``nvmlReturn``)."""
    return _BY_CODE.get(code, NvmlFailure)(f"{code_name(code)} ({where})", code)


def translate(exc: BaseException) -> NvmlError:
    """The typed error for ``exc``; its message is :func:`describe`'s one line."""
    if isinstance(exc, NvmlError):
        return exc
    return classify(exc)(describe(exc), code_of(exc))


def describe(exc: BaseException) -> str:
    """One line: ``NVML_ERROR_X: NVML's own text``, or the Python exception."""
    code = code_of(exc)
    if code is None:
        text = f"{type(exc).__name__}: {exc}"
    else:
        try:
            text = f"{code_name(code)}: {exc}"
        except Exception:  # pynvml's __str__ may call into a library that is not there
            text = code_name(code)
    return " ".join(text.split())

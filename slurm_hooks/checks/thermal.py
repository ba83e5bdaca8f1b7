"""Temperature thresholds and hardware slowdown (throttle) reasons."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity

#: Throttle reasons that point at the hardware or the room, not at the workload (NVML's clock event
#: reasons; the thermal violations amdsmi reports: socket, HBM, voltage regulator, PROCHOT).
HARDWARE_SLOWDOWN = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown",
                               "socket_thermal", "hbm_thermal", "vr_thermal", "prochot"})


def check_temperature(inp: CheckInput) -> Iterator[Finding]:
    warn, fail = inp.expect.temp_warn_c, inp.expect.temp_fail_c
    for gpu in inp.selected():
        t = gpu.temperature_c
        if t is None:
            continue
        if t >= fail:
            yield Finding("thermal", Severity.FAIL, Action.DRAIN, f"temperature {t} C (limit {fail} C)", gpu.index,
                          f"GPU {gpu.index} at {t} C")
        elif t >= warn:
            yield Finding("thermal", Severity.WARN, Action.WARN, f"temperature {t} C (warn at {warn} C)", gpu.index,
                          f"GPU {gpu.index} at {t} C")
        hbm = gpu.memory_temperature_c
        if hbm is not None and hbm >= fail:  # memory runs hotter than the die by design: told, never drained
            yield Finding("thermal", Severity.WARN, Action.WARN, f"memory (HBM) temperature {hbm} C (limit {fail} C)",
                          gpu.index, f"GPU {gpu.index} HBM at {hbm} C", rule="memory-thermal")


def check_throttle(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        hw = sorted(set(gpu.throttle_reasons or ()) & HARDWARE_SLOWDOWN)
        if hw:
            yield Finding("throttle", Severity.WARN, Action.WARN, f"clocks slowed down: {', '.join(hw)}", gpu.index,
                          f"GPU {gpu.index} throttled")

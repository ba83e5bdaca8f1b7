"""validate's `isolate-mpi` check: `[isolate] mpi` against what this Slurm's srun offers, read from
`srun --mpi=list` as Slurm 22.05 prints it."""

from __future__ import annotations

from fakes.config import sim_config

from slurm_hooks.preflight.environment import check_isolate_mpi, mpi_plugins
from slurm_hooks.preflight.results import Status
from slurm_hooks.runner import Completed

#: `srun --mpi=list`, Debian 12's Slurm 22.05.8.
MPI_LIST = ("MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
            "specific pmix plugin versions available: pmix_v4\n")


def srun(text: str, code: int = 0):
    seen = []

    def run(argv, timeout, **kw):
        seen.append(list(argv))
        return Completed(tuple(argv), code, text, "")
    return run, seen


def test_the_plugins_srun_lists_are_read_with_their_versions():
    assert mpi_plugins(MPI_LIST) == {"pmix", "none", "cray_shasta", "pmi2", "pmix_v4"}


def test_pmix_offered_passes_and_srun_is_asked_from_the_configured_bin_dir(tmp_path):
    run, seen = srun(MPI_LIST)
    [r] = check_isolate_mpi(sim_config(tmp_path), runner=run)
    assert r.status is Status.PASS and "srun offers it" in r.message
    assert seen[0][1:] == ["--mpi=list"] and seen[0][0].endswith("/srun")


def test_a_plugin_srun_does_not_offer_is_a_warning_naming_what_it_does(tmp_path):
    run, _ = srun(MPI_LIST)
    [r] = check_isolate_mpi(sim_config(tmp_path, '[isolate]\nmpi = "pmi3"\n'), runner=run)
    assert r.status is Status.WARN and "cray_shasta, none, pmi2, pmix, pmix_v4" in r.message


def test_srun_that_cannot_read_its_config_is_a_warning_not_a_pass(tmp_path):
    run, _ = srun("srun: fatal: Could not establish a configuration source\n", code=1)
    [r] = check_isolate_mpi(sim_config(tmp_path), runner=run)
    assert r.status is Status.WARN and "Could not establish" in r.message


def test_no_plugin_asked_for_needs_no_srun(tmp_path):
    run, seen = srun(MPI_LIST)
    [r] = check_isolate_mpi(sim_config(tmp_path, '[isolate]\nmpi = "none"\n'), runner=run)
    assert r.status is Status.PASS and seen == []

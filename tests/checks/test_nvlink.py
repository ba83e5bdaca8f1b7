"""NVLink error counters: one finding per GPU that names its links, whatever the number of links."""

from __future__ import annotations

import dataclasses

from checks.test_checks import load, problems, replace_gpu, run

from slurm_hooks.models import Action, NvLink, Severity


def _links(crc: int, replay: int, count: int = 18) -> tuple[NvLink, ...]:
    return tuple(NvLink(k, active=True, crc_errors=crc, replay_errors=replay) for k in range(count))


def _h100_with_gpu3_links(links: tuple[NvLink, ...]):
    snap = load("h100-healthy.json")
    return replace_gpu(snap, 3, nvlinks=links)


def test_every_link_of_a_gpu_over_both_counters_is_one_finding_not_36():
    findings = problems(run(_h100_with_gpu3_links(_links(crc=500, replay=300))))
    assert len(findings) == 1, [f.message for f in findings]
    (f,) = findings
    assert (f.check, f.severity, f.action, f.gpu, f.summary) == (
        "nvlink", Severity.WARN, Action.WARN, 3, "NVLink errors on GPU 3")
    assert f.message.startswith("NVLink errors on links 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17: "
                                "link 0 500 CRC, 300 replay; link 1 500 CRC, 300 replay; ")
    assert "; +14 more (max 100 CRC, 100 replay)" in f.message


def test_links_under_their_maximum_are_not_named():
    links = list(_links(crc=0, replay=0))
    links[7] = dataclasses.replace(links[7], crc_errors=101)
    links[12] = dataclasses.replace(links[12], replay_errors=150)
    (f,) = problems(run(_h100_with_gpu3_links(tuple(links))))
    assert f.message == "NVLink errors on links 7,12: link 7 101 CRC; link 12 150 replay (max 100 CRC, 100 replay)"


def test_two_gpus_with_link_errors_are_one_finding_each():
    snap = _h100_with_gpu3_links(_links(crc=500, replay=0))
    snap = replace_gpu(snap, 5, nvlinks=_links(crc=0, replay=900))
    assert [(f.gpu, f.rule) for f in problems(run(snap))] == [(3, "nvlink-errors"), (5, "nvlink-errors")]


def test_counters_at_their_maximum_pass():
    assert problems(run(_h100_with_gpu3_links(_links(crc=100, replay=100)))) == []

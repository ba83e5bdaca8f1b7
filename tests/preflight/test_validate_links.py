"""``validate`` and ``status`` say, every time, what keeps the node's links from being judged: a
counter saturated or refused on this boot, a counter memory that cannot be written."""

from __future__ import annotations

from fakes import ibtree

from slurm_hooks import config as config_mod
from slurm_hooks.commands import status, validate
from slurm_hooks.preflight.results import Status


def node_config(tmp_path, state: str = "") -> str:
    root = ibtree.lay(str(tmp_path / "sys"))
    path = tmp_path / "config.toml"
    path.write_text(f'[links]\nsysfs_root = "{root}"\n[state]\ndir = "{state or tmp_path / "state"}"\n'
                    f'[log]\naudit = "{tmp_path / "audit.jsonl"}"\n')
    return str(path)


def test_validate_says_the_saturated_counters_every_time_not_only_on_the_first_run(tmp_path):
    path = node_config(tmp_path)
    for _ in range(2):
        results = validate._links(path, "n1")
        assert len(results) == 8 and all(r.status is Status.WARN for r in results)
    assert results[1].message == ("IB mlx5_1 port 1: excessive_buffer_overrun_errors at 15, its maximum; "
                                  "link_downed at 255, its maximum: cannot be judged on this boot")
    assert results[1].fix == "clear the port's counters: perfquery -R (infiniband-diags), or reboot"


def test_validate_passes_a_node_whose_counters_were_cleared(tmp_path):
    path = node_config(tmp_path)
    root = str(tmp_path / "sys" / "class" / "infiniband")
    for device in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"):
        ibtree.set_counter(root, device, "excessive_buffer_overrun_errors", 0)  # perfquery -R
        ibtree.set_counter(root, device, "link_downed", 0)
    [r] = validate._links(path, "n1")
    assert (r.status, r.message) == (Status.PASS, "8 InfiniBand and 1 RoCE port(s): every counter can be judged")


def test_validate_and_status_say_a_counter_memory_that_cannot_be_written(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # [state] dir is a file: nothing is written under it
    path = node_config(tmp_path, state=str(blocked))
    said = [r.message for r in validate._links(path, "n1")]
    assert said[0] == f"cannot remember link counters: {blocked}/ib-n1.json: File exists"
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, lines = status._local_links(config_mod.load(path))
    assert here == "n1" and lines[0] == said[0] and len(lines) == 9

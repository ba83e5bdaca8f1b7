"""Slurm's numbering of a node's GPUs: gres.conf as slurmd reads it, ``slurmd -G``, job GRES detail."""

from __future__ import annotations

from pathlib import Path

import pytest
from paths import FIXTURES

from slurm_hooks.slurm import gres
from slurm_hooks.slurm.scontrol import parse_job_gpus

SLURM = Path(FIXTURES) / "slurm"


def files(conf: gres.GresConf) -> list[tuple[str, ...]]:
    return [d.files for d in conf.devices]


def test_gres_conf_numbers_gpus_in_file_order_for_this_node_only(tmp_path):
    (tmp_path / "gres.d").mkdir()
    (tmp_path / "gres.d" / "h100.conf").write_text(
        "NodeName=gpu[01-04] Name=gpu Type=h100 File=/dev/nvidia[4-5]\n")
    path = tmp_path / "gres.conf"
    path.write_text("# hand-written, reverse of PCI order\n"
                    "NodeName=gpu[01-04] Name=gpu Type=h100 File=/dev/nvidia7,/dev/nvidia6 \\\n"
                    "   Cores=0-31\n"
                    "NodeName=cpu[01-99] Name=gpu File=/dev/nvidia[0-1]\n"
                    "Include gres.d/*.conf\n"
                    "Name=nic File=/dev/infiniband/uverbs0\n"
                    "NodeName=gpu02 Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n")
    conf = gres.load(str(path), "gpu02")
    assert files(conf) == [("/dev/nvidia7",), ("/dev/nvidia6",), ("/dev/nvidia4",), ("/dev/nvidia5",),
                           ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21")]
    assert [d.index for d in conf.devices] == [0, 1, 2, 3, 4]
    assert conf.devices[4].mig and not conf.devices[0].mig
    assert conf.devices[0].where == f"{path}:2" and conf.files == (str(path), str(tmp_path / "gres.d" / "h100.conf"))
    assert files(gres.load(str(path), "gpu01"))[-1] == ("/dev/nvidia5",)  # the MultipleFiles line is gpu02's


def test_gres_conf_autodetect_global_and_per_node(tmp_path):
    conf = gres.parse("AutoDetect=nvml\nName=gpu Count=8\n", "n1")
    assert conf.autodetect == "nvml" and conf.devices == () and conf.fileless == 8
    conf = gres.parse("AutoDetect=nvml\nNodeName=n[1-2] AutoDetect=off Name=gpu File=/dev/nvidia0\n", "n2")
    assert conf.autodetect == "off" and files(conf) == [("/dev/nvidia0",)]


@pytest.mark.parametrize("text, where", [
    ("Name=gpu File=/dev/nvidia[3-1]\n", "gres.conf:1: File"),
    ("Name=gpu File=/dev/nvidia[0-70000]\n", "gres.conf:1: File"),
    ("NodeName=n1 Name=gpu File=/dev/nvidia0\nthis is not a pair\n", "gres.conf:2"),
    ("Include missing.conf\n", "gres.conf:1: Include"),
])
def test_gres_conf_errors_name_the_file_and_line(tmp_path, text, where):
    path = tmp_path / "gres.conf"
    path.write_text(text)
    with pytest.raises(gres.GresConfError) as err:
        gres.load(str(path), "n1")
    assert f"{tmp_path}/{where}" in str(err.value) and "\n" not in str(err.value)


def test_unreadable_gres_conf_is_one_error(tmp_path):
    with pytest.raises(gres.GresConfError, match="file not found"):
        gres.load(str(tmp_path / "nope"), "n1")


def test_slurmd_g_output_is_slurmds_list_in_gres_order():
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-h100.txt").read_text())
    assert [(d.index, d.files, d.type) for d in conf.devices] == [
        (0, ("/dev/nvidia0",), "nvidia_h100_80gb_hbm3"), (1, ("/dev/nvidia1",), "nvidia_h100_80gb_hbm3")]
    assert conf.source == "slurmd -G"


def test_slurmd_log_of_mig_instances_gives_their_files_and_unique_ids():
    conf = gres.parse_slurmd_g((SLURM / "slurmd-log-mig-a100.txt").read_text())
    assert len(conf.devices) == 4 and all(d.mig for d in conf.devices)
    first = conf.devices[0]
    assert first.file == "/dev/nvidia1" and first.files[1:] == ("/dev/nvidia-caps/nvidia-cap111",
                                                                  "/dev/nvidia-caps/nvidia-cap112")
    assert first.unique_id == "MIG-GPU-ede6b90f-50d8-42f2-57a1-8a531adc3192/12/0"


def test_device_minor_is_the_char_devices_minor_else_the_names_number(tmp_path):
    assert gres.device_minor("/dev/null") == 3  # a real char device: its minor, whatever its name
    assert gres.device_minor(str(tmp_path / "nvidia12")) == 12
    assert gres.device_minor(str(tmp_path / "nvidiactl-x")) is None


@pytest.mark.parametrize("text, want", [
    # Slurm 22.05 (the testbed): a CPU-only job's detail line holds no GRES.
    ("JobId=3 JobName=cpu JOB_GRES=(null)   Nodes=n1 CPU_IDs=0 Mem=0 GRES= MinCPUsNode=1", ()),
    # Shares of GPUs, by position: 23.02+ prints held/available per GPU, 22.05 the GPU's index.
    ("JobId=4 JOB_GRES=shard:2   Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:2(0/4,2/4,0/4,0/4) MinCPUsNode=1", (1,)),
    ("JobId=4 JOB_GRES=shard:2   Nodes=n1 CPU_IDs=0 Mem=0 GRES=shard:2(IDX:3) MinCPUsNode=1", (3,)),
    ("JobId=5 Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0),shard:1(0/4,0/4,1/4) MinCPUsNode=1", (0, 2)),
    ("JobId=6 Nodes=n1 CPU_IDs=0 Mem=0 GRES=mps(CNT:50) MinCPUsNode=1", None),  # which GPU: not said
    ("JobId=7 Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:12) MinCPUsNode=1", (12,)),  # a MIG instance's index
])
def test_job_gres_detail_gpu_shares_and_cpu_only(text, want):
    assert parse_job_gpus(text, "n1") == want


def test_slurmd_g_of_a_reverse_gres_conf_on_slurm_22_05_lists_gpus_in_file_order():
    # Captured on the testbed (`testbed up --gres-order 7,...,0 --shards 2`, Slurm 22.05.8): shard and gpu
    # records interleave, and Index= is the device file's number, not the GRES index.
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-22.05-gres-reverse.txt").read_text())
    assert [d.file.rsplit("/", 1)[1] for d in conf.devices] == [f"nvidia{k}" for k in range(7, -1, -1)]
    assert [d.index for d in conf.devices] == list(range(8))


def test_real_scontrol_detail_lines_of_gpu_cpu_only_and_shard_jobs():
    # Captured on the same testbed: jobs 1..4 are gpu:1, CPU-only, shard:1 and gpu:2, all on n1.
    lines = (SLURM / "scontrol-d-show-job-22.05-gres-reverse.txt").read_text().splitlines()
    assert [parse_job_gpus(line, "n1") for line in lines] == [(0,), (), (1,), (1, 2)]
    assert [parse_job_gpus(line, "n2") for line in lines] == [None] * 4



def test_slurmd_g_count_8_file_list_record_is_gres_0_to_7_in_file_order():
    # Captured from Slurm 22.05.8's `slurmd -G` with the testbed's gres.conf (one File= list of 8): one record,
    # Count=8, Index= the last file's number. Was GRES 0,2,4,...,14 (the index grew while it was consumed).
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-22.05-count8-file-list.txt").read_text())
    assert [d.index for d in conf.devices] == list(range(8))
    assert [d.file.rsplit("/", 1)[1] for d in conf.devices] == [f"nvidia{k}" for k in range(8)]
    assert conf.problem == ""


def test_slurmd_g_count_2_file_range_record_is_two_gpus():
    conf = gres.parse_slurmd_g("slurmd-n1: Gres Name=gpu Type=(null) Count=2 Index=0 ID=7696487 "
                               "File=/dev/nvidia[0-1] (null)\n")
    assert [(d.index, d.files) for d in conf.devices] == [(0, ("/dev/nvidia0",)), (1, ("/dev/nvidia1",))]


def test_slurmd_g_counts_only_its_final_list_not_the_autodetected_gpus_it_ignores():
    # Captured (Slurm 22.05.8, fake_gpus.conf of 4 GPUs, gres.conf File=nvidia[0-1]): slurmd logs the two
    # GPUs it ignores as GRES[gpu] lines, then its final list of two.
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-22.05-ignored-autodetected.txt").read_text())
    assert [d.file.rsplit("/", 1)[1] for d in conf.devices] == ["nvidia0", "nvidia1"]


def test_slurmd_g_that_rejects_every_gpu_for_a_cores_mismatch_is_unknown_not_their_log_lines():
    # Captured (same fake GPUs, gres.conf Cores=1 against the system's 0-1): every GPU is ignored, the final
    # list is empty; the log names each GPU twice (configured and system) and once more as ignored.
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-22.05-cores-mismatch.txt").read_text())
    assert conf.devices == () and "ignores or rejects" in conf.problem


def test_slurmd_g_of_24_11_prints_nothing_which_is_unknown_never_no_gpus():
    conf = gres.parse_slurmd_g((SLURM / "slurmd-G-24.11-empty.txt").read_text())
    assert conf.devices == () and conf.problem == gres.NO_LIST


def test_slurmd_debug_log_counts_the_gres_lines_under_its_final_list_header_only():
    log = ("slurmd: gres/gpu: _merge_system_gres_conf: WARNING: The following autodetected GPUs are being ignored:\n"
           "slurmd:     GRES[gpu] Type:(null) Count:1 Cores(2):0-1  Links:0,-1 Flags:HAS_FILE File:/dev/nvidia1 "
           "UniqueId:(null)\n"
           "slurmd: gres/gpu: Final normalized gres.conf list:\n"
           "slurmd:     GRES[gpu] Type:(null) Count:1 Cores(2):0-1  Links:-1,0 Flags:HAS_FILE File:/dev/nvidia0 "
           "UniqueId:(null)\n"
           "slurmd: other line\n")
    assert [d.file for d in gres.parse_slurmd_g(log).devices] == ["/dev/nvidia0"]


def test_gres_list_split_is_one_function_for_slurm_conf_and_job_detail():
    assert gres.split_list("gpu:2(IDX:0-1), shard:2(2/4,0/4),(null),") == ["gpu:2(IDX:0-1)", "shard:2(2/4,0/4)"]

@pytest.mark.parametrize("text,expected", [
    ("gpu:8", [("gpu", "", 8)]),
    ("gpu", [("gpu", "", 1)]),
    ("gpu:h100:4(S:0),gpu:h100:4(S:1)", [("gpu", "h100", 4), ("gpu", "h100", 4)]),
    ("gpu:a100:no_consume:2,mps:100", [("gpu", "a100", 2), ("mps", "", 100)]),
    ("gpu:8(S:0,1)", [("gpu", "", 8)]),
    ("shard:1K", [("shard", "", 1024)]),
    ("(null)", []),
    ("", []),
])
def test_slurm_conf_gres_strings_parse_into_name_type_and_count(text, expected):
    assert [(g.name, g.type, g.count) for g in gres.parse_counts(text)] == expected

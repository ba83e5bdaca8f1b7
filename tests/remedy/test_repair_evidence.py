"""The evidence kept before a repair: every file of the bundle bounded, not only the kernel log's tail."""

from __future__ import annotations

import json
import os
import stat
import sys

from fakes.config import sim_config, sim_node

from slurm_hooks.remedy import repair

#: ``nvidia-smi -q`` of 8 GPUs, each listing 300 processes (an MPS server's clients left behind by
#: a crashed job): about 740 KB, nearly three times the per-file cap.
NVIDIA_SMI_Q = r'''#!{python}
import sys
if sys.argv[1:] != ["-q"]:
    sys.exit("nvidia-smi: only -q here")
out = ["==============NVSMI LOG==============", "", "Driver Version                            : 550.90.07",
       "CUDA Version                              : 12.4", "", "Attached GPUs                             : 8"]
for gpu in range(8):
    out += ["GPU 00000000:%02X:00.0" % (0x17 + gpu), "    Product Name                          : NVIDIA H100 80GB HBM3",
            "    Processes"]
    for n in range(300):
        out += ["        GPU instance ID                   : N/A", "        Compute instance ID               : N/A",
                "        Process ID                        : %d" % (40000 + gpu * 300 + n),
                "            Type                          : M+C",
                "            Name                          : /usr/bin/python3",
                "            Used GPU Memory               : 250 MiB"]
out.append("end of GPU 7")
print("\n".join(out))
'''


def test_a_long_nvidia_smi_q_is_kept_to_the_per_file_cap_like_the_kernel_log(tmp_path, monkeypatch):
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("NVRM: Xid (PCI:0000:17:00): 79, pid=1234, GPU has fallen off the bus.\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(NVIDIA_SMI_Q.replace("{python}", sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    cfg = sim_config(tmp_path, f'[watch]\nkmsg = "{kernel_log}"\n')
    _, w = sim_node(cfg, "IDLE")

    path = repair.keep_evidence(w, None, "replace")

    with open(os.path.join(path, "manifest.json")) as fh:
        manifest = json.load(fh)
    kept = os.path.join(path, "nvidia-smi-q.txt")
    assert manifest["files"]["nvidia-smi-q.txt"] == os.path.getsize(kept) == repair.EVIDENCE_FILE_MAX, manifest
    assert manifest["files"]["kernel-log.txt"] == os.path.getsize(kernel_log)  # a short file is kept whole
    with open(kept, encoding="utf-8") as fh:
        assert fh.read().rstrip().endswith("end of GPU 7")  # the tail, as the kernel log's

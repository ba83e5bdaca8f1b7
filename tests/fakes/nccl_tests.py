"""A stand-in for nccl-tests' ``all_reduce_perf`` on one node: prints the captured output's format
(tests/fixtures/nccl_tests/all_reduce_perf_1node_8gpu.txt) with the bus bandwidth the node's
fabric gives, read from ``--state`` (JSON): ``nics`` when NVLink and shared memory are off
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, the traffic through the NICs), else ``nvlink``;
``exit`` its exit code, ``cut`` how many characters of its output it prints (a run cut short).

    python nccl_tests.py --state STATE.json [all_reduce_perf's own arguments]
"""

from __future__ import annotations

import json
import os
import re
import sys

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "nccl_tests",
                       "all_reduce_perf_1node_8gpu.txt")


def main(argv: list[str]) -> int:
    state = json.load(open(argv[argv.index("--state") + 1]))
    nics = os.environ.get("NCCL_P2P_DISABLE") == "1" and os.environ.get("NCCL_SHM_DISABLE") == "1"
    busbw = float(state["nics" if nics else "nvlink"])
    text = open(FIXTURE).read()
    text = re.sub(r"(\s)68\.66(\s)", lambda m: f"{m.group(1)}{busbw:.2f}{m.group(2)}", text)
    text = text.replace("# Avg bus bandwidth    : 68.6248", f"# Avg bus bandwidth    : {busbw:.4f}")
    if state.get("wrong"):
        text = re.sub(r"(\s)0\n# Avg", f"\\g<1>{state['wrong']}\n# Avg", text)
    sys.stdout.write(text[:state["cut"]] if "cut" in state else text)
    return int(state.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# Device check for a machine with a real NVIDIA GPU (written for one H200).
#
# Installs the package, runs the real-GPU tests, and times the NVML probe (median
# of 20 snapshots in one process) and `slurm-hooks check --dry-run --json` with
# the nvml backend (median of 20 runs, Python start-up included). Everything goes
# to $OUT when set (else a temporary folder): the log, the pytest result, one
# snapshot as JSON, one CLI report and the timings.
#
#   bash bench/gpu_device_check.sh            # from anywhere; needs python3 with pip
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d -t slurm-hooks-gpu.XXXXXX)}"
mkdir -p "$OUT"
WORK="$(mktemp -d -t slurm-hooks-work.XXXXXX)"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/gpu_device_check.log") 2>&1
status=0

echo "== machine"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,persistence_mode,temperature.gpu,power.draw \
    --format=csv || echo "nvidia-smi failed (continuing: the probe does not need it)"
"$PY" --version

echo "== install"
# The device may be offline: fall back to the dependencies already there.
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$PY" -m pip install -q --retries 1 --timeout 10 -e '.[test]'; then
    echo "full install failed (offline?); installing without dependencies"
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import click, jinja2, pynvml, pytest, slurm_hooks; print('imports ok, pynvml', pynvml.__file__)" || exit 1
# The console script installed beside this Python, else the module: both pay the same start-up.
BIN="$(dirname "$(command -v "$PY")")"
if [ -x "$BIN/slurm-hooks" ]; then CLI=("$BIN/slurm-hooks"); else CLI=("$PY" -m slurm_hooks); fi

echo "== real-GPU tests"
# -p no:kmock: kmock's pytest plugin needs pytest-asyncio, which the [test] extra does not pull in.
"$PY" -m pytest -p no:kmock -p no:cacheprovider -m gpu tests/probes/test_nvml_real.py -q -rs \
    --junitxml="$OUT/pytest-gpu.xml" || status=1

echo "== probe: median of 20 in-process snapshots"
"$PY" - "$OUT" <<'EOF' || status=1
import json, statistics, sys, time
from slurm_hooks.models import snapshot_to_dict
from slurm_hooks.probes.nvml import NvmlProbe

out = sys.argv[1]
probe = NvmlProbe("bench-node", kmsg_path="/dev/kmsg")
start = time.perf_counter()
first = probe.snapshot()
cold = time.perf_counter() - start
times = []
for _ in range(20):
    start = time.perf_counter()
    snap = probe.snapshot()
    times.append(time.perf_counter() - start)
with open(f"{out}/snapshot.json", "w") as fh:
    json.dump(snapshot_to_dict(snap), fh, indent=1)
result = {"gpus": len(snap.gpus), "error": snap.error, "cold_s": round(cold, 4),
          "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
          "max_s": round(max(times), 4), "field_errors": [[g.index, *e] for g in snap.gpus for e in g.errors]}
with open(f"{out}/probe_timing.json", "w") as fh:
    json.dump(result, fh, indent=1)
print(json.dumps(result))
sys.exit(0 if first.error is None and snap.error is None and snap.gpus else 1)
EOF

echo "== CLI: median of 20 'check --dry-run --json' runs (nvml backend)"
cat >"$WORK/config.toml" <<EOF
[gpu]
backend = "nvml"

[log]
audit = "$WORK/audit.jsonl"

[state]
dir = "$WORK/state"

[watch]
kmsg = "/dev/kmsg"
EOF
mkdir -p "$WORK/state"
"$PY" - "$OUT" "$WORK/config.toml" "${CLI[@]}" <<'EOF' || status=1
import json, statistics, subprocess, sys, time

out, config, cli = sys.argv[1], sys.argv[2], sys.argv[3:]
argv = [*cli, "check", "--config", config, "--node", "bench-node", "--dry-run", "--json"]
times, codes, last = [], [], None
for _ in range(20):
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    times.append(time.perf_counter() - start)
    codes.append(proc.returncode)
    last = proc
with open(f"{out}/cli_report.json", "w") as fh:
    fh.write(last.stdout)
if last.stderr.strip():
    print("stderr of the last run:", last.stderr.strip()[-2000:])
result = {"argv": argv, "exit_codes": sorted(set(codes)), "median_s": round(statistics.median(times), 4),
          "min_s": round(min(times), 4), "max_s": round(max(times), 4)}
with open(f"{out}/cli_timing.json", "w") as fh:
    json.dump(result, fh, indent=1)
print(json.dumps(result))
print("report:", last.stdout.strip()[:2000])
try:
    json.loads(last.stdout)
except ValueError:
    sys.exit(1)
sys.exit(0 if set(codes) <= {0, 1} else 1)  # 1 = unhealthy node, still a working run
EOF

rm -rf "$WORK"
echo "== done: status $status, results in $OUT"
exit "$status"

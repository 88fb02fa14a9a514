#!/usr/bin/env bash
# Every GPU check of the workbook in one run, for a lent GPU machine (or your own GPU box).
#
#   OUT=/some/dir bash scripts/gpu_check.sh        # results land in $OUT (default build/gpu_check)
#
# Runs with whatever python has a CUDA torch (PYTHON=python3 by default) and the repo on
# PYTHONPATH, so it needs no install step. Each check is bounded by its own timeout so one
# slow step cannot eat the rest; each prints one line when it is skipped and why.
# Commit what comes back under data/results/ (the notebooks show it beside local runs).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS CMD... : run with a timeout, keep the log, never abort the script
  local name=$1 secs=$2; shift 2
  echo "== $name (limit ${secs}s)"
  timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}

nvidia-smi -L | tee "$OUT/nvidia-smi.txt" || echo "no nvidia-smi: not a GPU machine"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; print(torch.__version__, torch.cuda.get_device_name())" \
  || { echo "skipped everything: this python's torch has no CUDA device"; exit 1; }

step doctor      60 "$PY" -c "from labkit import device; print(device.describe().report())"
step bench      240 "$PY" -m labkit bench --device cuda --out "$OUT/bench.json"
step bench_check 60 "$PY" -m labkit.benches.check
step model_bench 300 "$PY" -m labkit.benches.model --device cuda --dtype bf16 --presets tiny,1b \
  --compile --compile-presets 1b --json "$OUT/model_bench.json"
step sim_bench   60 "$PY" -m labkit.benches.sim
step sparse24    60 "$PY" -m labkit.benches.prune --gemm24-only
# The case study runs its server on the CPU: a many-core box shows what the lock costs when the fixed
# service has cores to spare (on 2 cores the fixed service queues too).
step case_study 480 "$PY" -m labkit.benches.case_study --json "$OUT/case_study.json"
if "$PY" -c "import papermill" 2>/dev/null; then
  step notebooks 600 "$PY" -m labkit notebooks --size full --out "$OUT/notebooks"
else
  echo "skipped notebooks: papermill is not installed for $PY (carry its wheels, see the device notes)"
fi
ls -la "$OUT"

#!/usr/bin/env bash
# Every GPU measurement of issues 3 and 6 in one go, for a short lease on a CUDA machine:
#   bash benchmarks/gpu_session.sh OUTDIR
# Needs the project's Python dependencies importable (python3 -m pip install -e . on the machine).
# Each step has its own time limit so a slow one cannot starve the rest; logs go to OUTDIR.
set -u
out=${1:?usage: gpu_session.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
step() {  # step NAME SECONDS CMD...: run with a limit, log to OUTDIR/NAME.txt, never stop the session
    local name=$1 limit=$2; shift 2
    echo "=== $name ($(date +%T), limit ${limit}s): $*"
    timeout "$limit" "$@" >"$out/$name.txt" 2>"$out/$name.err"
    echo "=== $name exit $? ($(date +%T))"
    tail -n 25 "$out/$name.txt"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
step gpu_check 120 $py benchmarks/gpu_check.py
step bilm_fp32_fused 150 $py benchmarks/bilm_forward.py --device cuda --batches 16 --rounds 3
step bilm_fp32_unfused 90 $py benchmarks/bilm_forward.py --device cuda --batches 16 --rounds 3 --skip-naive --no-fused
step bilm_bf16_fused 90 $py benchmarks/bilm_forward.py --device cuda --batches 16 --rounds 3 --skip-naive --bf16
step embed "${EMBED_LIMIT:-200}" $py benchmarks/embed.py --device cuda --storage local --workers 1 \
    --cpus-per-worker 4 --sentences 200000 --scales 1 --raw-sentences 20000 --layers top --dtype float16
tail -n 3 "$out/embed.err"

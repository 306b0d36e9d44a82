#!/usr/bin/env bash
# Every GPU measurement of the embed stage (issue 23) in one go, for a short lease on a CUDA machine:
#   bash benchmarks/gpu_embed_session.sh OUTDIR             # on the GPU machine, under 8 minutes
#   DEVICE=cpu bash benchmarks/gpu_embed_session.sh OUTDIR  # a dry run of the script on a CPU
# Needs the project's Python dependencies importable (the GPU machine reaches no registry: carry
# wheels of ray, webdataset, wandb, omegaconf, boto3, h5py, tqdm for its Python and unpack them onto
# PYTHONPATH, as the training session script's header says). Logs go to OUTDIR, tables to
# OUTDIR/summary.txt.
#   1. correctness: the static-shape passes against both fixture sets on the GPU, and the CUDA tests
#   2. raw forward (model only, static shapes, CUDA graphs): original (small on the CPU), float32 / tf32 /
#      bf16, top float16 and all float32: tokens/s, error against float32, GPU peak, graph count
#   3. end to end, one actor per GPU, local disk, at 1x and 4x (the 4x job's extra tokens over its
#      extra seconds: the steady rate): original, --layers top --dtype float16 packed in float32 and
#      bf16, each with its raw forward beside it; between them the raw bf16 forward at 4x and 16x
#      the rows of a pass (the allennlp layout and --layers all were measured on 2026-11-27)
set -u
out=${1:?usage: gpu_embed_session.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
deadline=$((SECONDS + ${BUDGET:-480}))
work=$(mktemp -d /tmp/elmo-gpu-embed-XXXXXX)
logs=$work
. "$(dirname "$0")/session_step.sh"
if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
    raw=(--device cuda --sizes original --sentences 20000)
    # one actor per GPU with 2 CPUs; the other 14 cores prepare shards (read, tokenize, character ids)
    # 1x and 4x: the 4x job's extra tokens over its extra seconds give the rate once the pipeline is full
    e2e=(--device cuda --preset original --workers 1 --cpus-per-worker 2 --num-cpus "$(nproc)" --sentences 50000 --raw-sentences 20000 --scales 1 4 --storage local --lines-per-shard 5000 --batch-tokens 8192)
else
    raw=(--device cpu --sizes small --sentences 200 --precisions float32,bf16)
    e2e=(--device cpu --preset small --workers 1 --sentences 300 --raw-sentences 200 --scales 1 --storage local --lines-per-shard 150)
fi
[ "$device" = cuda ] && step cuda_tests 90 $py -m pytest -q -m cuda -p no:cacheprovider tests/elmo_model tests/pipeline/train/test_snapshot.py
# the end-to-end row first: it is what a short lease must not lose (float32 at 4x ran out of GPU
# memory before the bucket shapes shared one warm-up stream: this row checks that fix)
step e2e_top_f16_packed 150 $py benchmarks/embed.py "${e2e[@]}" --layers top --dtype float16 --layout packed
step raw_forward 90 $py benchmarks/static_forward.py "${raw[@]}"
if [ "$device" = cuda ]; then
    # bf16 ran no faster than tf32 at 8,192 tokens a pass (bound by its sequential steps, not its
    # products): the same steps with 4x and 16x the rows
    step raw_bf16_32k 70 $py benchmarks/static_forward.py --device cuda --sizes original --sentences 60000 --precisions bf16 --batch-tokens 32768 --max-rows 4096
    step raw_bf16_128k 70 $py benchmarks/static_forward.py --device cuda --sizes original --sentences 60000 --precisions bf16 --batch-tokens 131072 --max-rows 16384
fi
step e2e_top_f16_packed_bf16 120 $py benchmarks/embed.py "${e2e[@]}" --layers top --dtype float16 --layout packed --precision bf16
rm -rf "$work"
echo "summary: $out/summary.txt"

#!/usr/bin/env bash
# Every GPU measurement of the embed stage in one go, for a short lease on a CUDA machine:
#   bash benchmarks/gpu_embed_session.sh OUTDIR             # on the GPU machine, under 8 minutes
#   DEVICE=cpu bash benchmarks/gpu_embed_session.sh OUTDIR  # a dry run of the script on a CPU
# Needs the project's Python dependencies importable: the GPU machine reaches no registry, so a call
# carries those its image lacks (`bash infra/gpu_site.sh` packs them) and names them with SITE:
#   run(carry=[".whl"], command='SITE=.whl/site.tar.xz BUDGET=480 bash benchmarks/gpu_embed_session.sh $OUT')
# Tables go to OUTDIR/summary.txt.
#   1. correctness: the CUDA tests (static passes, graphs, the embed actor's device-side compaction and
#      pinned buffers against the CPU's vectors) and both fixture sets (raw_forward's first lines)
#   2. raw bf16 forward (model only) of original at 32,768 and 131,072 tokens a pass: does a pass stay
#      bound by its sequential steps when it has 4x and 16x the rows of the last GPU run?
#   3. end to end, one actor with 8 CPUs (7 of its threads write shards), the other cores preparing,
#      local disk, 1x and 4x, the pass size the stage chooses for the GPU (batch_tokens=0):
#      original bf16, packed top float16 (then, 5., pool=mean); each with the command-to-first-shard time
#   4. the host side alone on this node's cores (benchmarks/embed_host.py, 1 to 8 threads)
# The steps' limits add up to the 480 s budget: a short lease loses the last ones first.
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
use_site
if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
    raw=(--device cuda --sizes original --sentences 60000 --precisions bf16)
    host=(--threads 1 2 4 8 --shards 2)
    # one actor per GPU with 8 CPUs (one thread runs the passes, the others write shards); the
    # other cores prepare shards (read, tokenize, character ids); 1x and 4x: the 4x job's extra
    # tokens over its extra seconds give the rate once the pipeline is full
    e2e=(--device cuda --preset original --workers 1 --cpus-per-worker 8 --num-cpus "$(nproc)" --sentences 50000 --raw-sentences 20000 --scales 1 4 --storage local --lines-per-shard 5000 --batch-tokens 0 --precision bf16)
else
    raw=(--device cpu --sizes small --sentences 200 --precisions bf16)
    host=(--threads 1 2 --shards 1 --lines 500)
    e2e=(--device cpu --preset small --workers 1 --sentences 300 --raw-sentences 200 --scales 1 --storage local --lines-per-shard 150)
fi
[ "$device" = cuda ] && step cuda_tests 75 $py -m pytest -q -m cuda -p no:cacheprovider tests/elmo_model tests/pipeline/embed/test_embedder.py tests/pipeline/train/test_snapshot.py
step raw_bf16_32k 60 $py benchmarks/static_forward.py "${raw[@]}" --batch-tokens 32768 --max-rows 2048
step raw_bf16_128k 60 $py benchmarks/static_forward.py "${raw[@]}" --batch-tokens 131072 --max-rows 8192
step e2e_top_f16_packed_bf16 150 $py benchmarks/embed.py "${e2e[@]}" --layers top --dtype float16 --layout packed
step host_side 40 $py benchmarks/embed_host.py "${host[@]}" --cases "packed top float16" "pooled top float16"
step e2e_top_pooled_bf16 95 $py benchmarks/embed.py "${e2e[@]}" --layers top --dtype float16 --layout packed --pool mean
rm -rf "$work"
echo "summary: $out/summary.txt"

#!/usr/bin/env bash
# Every GPU measurement of the embed stage in one go, for a short lease on a CUDA machine:
#   bash benchmarks/gpu_embed_session.sh OUTDIR             # on the GPU machine, under 8 minutes
#   DEVICE=cpu bash benchmarks/gpu_embed_session.sh OUTDIR  # a dry run of the script on a CPU
# Needs the project's Python dependencies importable: the GPU machine reaches no registry, so a call
# carries those its image lacks (`bash infra/gpu_site.sh` packs them) and names them with SITE:
#   run(carry=[".whl"], command='SITE=.whl/site.tar.xz BUDGET=540 bash benchmarks/gpu_embed_session.sh $OUT')
# Tables go to OUTDIR/summary.txt.
#   1. correctness: every CUDA test of the suite (static passes, graphs, the embed actor's device-side
#      compaction and pinned buffers against the CPU's vectors, the training step and snapshot) and
#      both fixture sets on the GPU (benchmarks/gpu_check.py)
#   2. raw bf16 forward (model only) of original at 131,072 and 32,768 tokens a pass, with the share of
#      positions that are real tokens, and the kernels of the 131,072 run (where a pass's time goes)
#   3. the host side alone on this node's cores (benchmarks/embed_host.py, 1 to 8 writers): on threads
#      of one process, then writer processes (the stage's design since 53): packed top float16 and
#      AllenNLP's layout, whose every dataset is an h5py call (h5py runs one at a time in a process)
#   4. the long job, end to end: one actor with 8 CPUs (8 writer processes commit its shards), the other
#      cores preparing, local disk, 800,000 sentences (16x the sample's 50,000: 20M tokens), the pass
#      size the stage chooses for the GPU (batch_tokens=0), original bf16: packed top float16, then
#      all layers float16, then pool=mean; each with its start-up phases and its tokens/s after the
#      first commit (the figure a long job runs at)
# The steps' limits add up to 540 s: a shorter BUDGET loses the last ones first.
set -u
. "$(dirname "$0")/session_step.sh"
session_begin embed 480 "${1:-}"
use_site
if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
    raw=(--device cuda --sizes original --sentences 30000 --precisions bf16)  # the sample holds 31,102
    host=(--threads 1 2 4 8 --shards 2 --lines 2000)
    # one actor per GPU with 8 CPUs (one thread runs the passes, the others write shards); the
    # other cores prepare shards (read, tokenize, character ids); one long job (16x), its rate after
    # its first commit read from its own summary
    e2e=(--device cuda --preset original --workers 1 --cpus-per-worker 8 --num-cpus "$(nproc)" --sentences 50000 --raw-sentences 20000 --scales 16 --storage local --lines-per-shard 5000 --batch-tokens 0 --precision bf16)
else
    raw=(--device cpu --sizes small --sentences 200 --precisions bf16)
    host=(--threads 1 2 --shards 1 --lines 300)
    e2e=(--device cpu --preset small --workers 1 --sentences 300 --raw-sentences 200 --scales 4 --storage local --lines-per-shard 150)
fi
# every CUDA test of the suite (the files that use the mark: embed's device-side compaction and pinned
# buffers, the graphs' warm-up memory, static inference, the training step and snapshot, checkpoints)
[ "$device" = cuda ] && step cuda_tests 90 $py -m pytest -q -m cuda -p no:cacheprovider $(grep -rl 'pytest.mark.cuda' tests)
# both reference fixture sets through the fused Triton cell and without it, float32 (TF32 off)
[ "$device" = cuda ] && step gpu_check 40 $py benchmarks/gpu_check.py
step raw_bf16_128k 50 $py benchmarks/static_forward.py "${raw[@]}" --batch-tokens 131072 --max-rows 8192 --profile
step raw_bf16_32k 35 $py benchmarks/static_forward.py "${raw[@]}" --batch-tokens 32768 --max-rows 2048
cases=(--cases "packed top float16" "allennlp top float16")
step host_side_threads 30 $py benchmarks/embed_host.py "${host[@]}" "${cases[@]}"
step host_side_processes 30 $py benchmarks/embed_host.py "${host[@]}" "${cases[@]}" --processes
step e2e_top_f16_packed_bf16 100 $py benchmarks/embed.py "${e2e[@]}" --layers top --dtype float16 --layout packed
step e2e_all_f16_packed_bf16 110 $py benchmarks/embed.py "${e2e[@]}" --layers all --dtype float16 --layout packed
step e2e_top_pooled_bf16 55 $py benchmarks/embed.py "${e2e[@]}" --layers top --dtype float16 --layout packed --pool mean
tar czf "$out/logs.tar.gz" -C "$work" logs  # every step's whole log (a failing test's traceback)
rm -rf "$work"
echo "summary: $out/summary.txt"

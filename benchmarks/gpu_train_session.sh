#!/usr/bin/env bash
# Every GPU measurement of issue 12 (GPU training) in one go, for a short lease on a CUDA machine:
#   bash benchmarks/gpu_train_session.sh OUTDIR            # on the GPU machine, under 8 minutes
#   DEVICE=cpu bash benchmarks/gpu_train_session.sh OUTDIR  # a dry run of the script on a CPU
# Needs the project's Python dependencies importable: a GPU call carries those its image lacks
# (`bash infra/gpu_site.sh` packs them) and names them with SITE, e.g. the reference model:
#   run(carry=[".whl"], timeout_s=580, command='SITE=.whl/site.tar.xz REF_CORPUS=.whl/ref-corpus.txt.xz
#       PART=reference BUDGET=550 bash benchmarks/gpu_train_session.sh $OUT')
# Each step has its own time limit so a slow one cannot starve the rest; logs go to OUTDIR, the
# tables to OUTDIR/summary.txt.
#   1. correctness: the fixture sets on the GPU (gpu_check.py), the training path's kernels and
#      CUDA graph against their references (gpu_train_check.py), the suite's CUDA tests (pytest -m
#      cuda: the files that use the mark, so a module needing a package the machine lacks is not
#      collected)
#   2. benchmarks/train_step.py --device cuda: small and original, bf16 and float32, batch 128 up,
#      with a profiler kernel summary of original bf16 at batch 128
#   3. a real run through Ray Train: shard the sample corpus, 300 steps of small on 1 GPU (NCCL,
#      bf16, the divergence guard on), a rerun to 400 steps that resumes, the export loaded on the
#      CPU; 300 steps in float32 with the same seed for the held-out perplexity comparison; 300
#      steps in bf16 without the offset penalty (issue 13's fix) for the contrast
#   4. tokens-to-quality against the batch (PART=convergence; needs CORPUS=corpus.txt.xz carried in),
#      and from its curves the paper's budget on 8 GPUs (benchmarks/paper_budget.py)
#   5. checkpoints and shard reads off the critical path: checkpoint_stall.py, checkpoint_memory.py,
#      shard_boundaries.py (on a CPU only: it needs no GPU), and the stall table again with the files on tmpfs (the save's cost apart
#      from the disk's speed)
#   6. the reference model (PART=reference; needs REF_CORPUS=corpus.txt.xz carried in, built by
#      `benchmarks/debian_corpus.py OUT --leave-out wordnet-base --without-probe-sentences`):
#      sharded here (the default vocabulary, the Kneser-Ney 3- and 5-gram), `small` with the preset's GPU recipe (REF_RECIPE:
#      more overrides) in bf16 for a time budget (REF_BUDGET seconds, 300) through benchmarks/time_to_target.py:
#      its curve against tokens and seconds beside the split's Kneser-Ney 3- and 5-gram (and an earlier
#      curve, REF_PREVIOUS), then `elmo probe --control` of its export and `elmo embed` of 50,000 lines
#      of the corpus; the figures come back under OUTDIR/reference, the weights do not
#   7. two recipes at equal minutes (PART=recipe: REC_A and REC_B for REC_BUDGET each)
# A corpus travels xz-compressed (gzip works too): beside the packages (.whl/site.tar.xz, 31 MB) a
# gzipped Debian corpus (20-24 MB) would pass the call's 64 MiB carry limit, its xz (14-16 MB) does not.
set -u
. "$(dirname "$0")/session_step.sh"
session_begin train 540 "${1:-}"
steps=${STEPS:-300}            # the dry run uses a few steps
resume_steps=$((steps + (steps + 2) / 3))
extra=${EXTRA:-}               # more train overrides (the dry run: a small batch)
part=${PART:-all}              # bench (1, 2, 5), run (3), io (the CUDA tests and 5), convergence (4), reference (6), recipe (7), or all
use_site
if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
    gpu="use_gpu=true"
    bench=(--device cuda --json "$logs/train_step.json" --steps 10 --warmup 5)
    sizes=(--batch-sizes 128,512,2048)
    small_sizes=(--batch-sizes 128,1024)
    # a save every 100 steps (2.7 s of H200 steps apart, the default is 1,250) and 200 steps a mode:
    # every 20 steps (0.53 s) the H200 outran a 1.1 GB fsync'd write and the table measured the
    # waits for the storage, not the snapshot (2026-11-28)
    stall=(--device cuda --presets original --checkpoint-batch-size 128 --checkpoint-every 100 --checkpoint-steps 200 --checkpoint-repeats 1)
    memory=(--device cuda --memory-presets original --memory-vocabs 793471)
    boundaries=()
else
    gpu="use_gpu=false threads_per_worker=2"
    bench=(--device cpu --steps 1 --warmup 1 --workers 1)
    sizes=()
    small_sizes=()
    stall=(--device cpu --checkpoint-steps 20 --checkpoint-every 10 --checkpoint-repeats 1)
    memory=(--device cpu --memory-presets small --memory-vocabs 20000)
    boundaries=(--boundary-steps 100 --boundary-sentences 4000)
fi
$py -c "import torch, ray; print('torch', torch.__version__, 'ray', ray.__version__)"

plain_corpus() {  # plain_corpus FILE NAME: FILE (xz or gzip) as plain text at $work/NAME.txt; prints that path
    $py - "$1" "$work/$2.txt" <<'PYEOF'
import gzip, lzma, shutil, sys
source, target = sys.argv[1:]
with (lzma.open if source.endswith(".xz") else gzip.open)(source, "rb") as text, open(target, "wb") as out:
    shutil.copyfileobj(text, out, 1 << 20)
PYEOF
    echo "$work/$2.txt"
}

in_part() {  # in_part PART...: whether this session's PART runs a step that belongs to those parts
    [ "$part" = all ] && return 0
    local p
    for p in "$@"; do [ "$p" = "$part" ] && return 0; done
    return 1
}

# 1. correctness
if in_part bench; then
    [ "$device" = cuda ] && step gpu_check 45 $py benchmarks/gpu_check.py
    step train_check 60 $py benchmarks/gpu_train_check.py --device "$device"
fi
in_part bench io && step cuda_tests 60 $py -m pytest -q -p no:cacheprovider -m cuda $(grep -rl 'pytest.mark.cuda' tests)

# 3. the Ray Train run
if in_part run; then
train() {  # train NAME LIMIT STEPS [key=value ...]
    local name=$1 limit=$2 steps=$3; shift 3
    step "$name" "$limit" $py -m jobs.cli train --shards "$work/shards" --output "$work/$name" --preset small \
        --workers 1 $gpu --max-steps "$steps" wandb.mode=disabled log_every=50 checkpoint_every=100 seed=0 $extra "$@"
}
step shard 40 $py -m jobs.cli shard --input pipeline/data/kjv-sample.txt.gz --output "$work/shards"
train run_bf16 70 "$steps"
cp "$work/run_bf16/metrics.jsonl" "$logs/run_bf16.metrics.jsonl" 2>/dev/null
train run_bf16 90 "$resume_steps"   # the same output: resumes from the last checkpoint
cp "$work/run_bf16/metrics.jsonl" "$logs/run_bf16_resumed.metrics.jsonl" 2>/dev/null
train run_f32 70 "$steps" bf16=false
cp "$work/run_f32/metrics.jsonl" "$logs/run_f32.metrics.jsonl" 2>/dev/null
step export_check 45 $py benchmarks/gpu_train_check.py --device "$device" --export "$work/run_bf16/export" --skip-step-checks
# the same bf16 run without the divergence fix (docs/training.md#divergence), for the contrast
train run_bf16_no_offset_penalty 70 "$steps" softmax.offset_penalty=0
cp "$work/run_bf16_no_offset_penalty/metrics.jsonl" "$logs/run_bf16_no_offset_penalty.metrics.jsonl" 2>/dev/null
fi

# 2. the step benchmark of original (its profile decides what to speed up next)
if in_part bench; then
    if [ "$device" = cuda ]; then
        step bench_original 110 $py benchmarks/train_step.py "${bench[@]}" --presets original "${sizes[@]}"
    else
        step bench_cpu 120 $py benchmarks/train_step.py "${bench[@]}"
    fi
fi

# 5. checkpoints and shard reads off the critical path
in_part bench io && step checkpoint_stall 90 $py benchmarks/checkpoint_stall.py "${stall[@]}"
in_part bench io && step checkpoint_memory 45 $py benchmarks/checkpoint_memory.py "${memory[@]}"
# the shard reads take a stand-in step and no GPU: measured on the CPU machine (docs/benchmarks.md)
[ "$device" = cpu ] && in_part bench io && step shard_boundaries 20 $py benchmarks/shard_boundaries.py "${boundaries[@]}"
# the same checkpoint table with the files in memory (tmpfs): what the step pays for a save apart
# from the storage's write speed (a save waits for the previous one when the storage is slower than
# the interval); only where /dev/shm has room for the table's checkpoints (4 runs x keep 2)
shm_free_mib=$(df -Pm /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
if in_part bench io && [ "${shm_free_mib:-0}" -ge 4096 ]; then
    shm=$(mktemp -d /dev/shm/elmo-bench-XXXXXX)
    step checkpoint_stall_tmpfs 90 $py benchmarks/checkpoint_stall.py "${stall[@]}" --checkpoint-dir "$shm"
    rm -rf "$shm"
elif in_part bench io; then
    echo "=== io_tmpfs skipped: /dev/shm has ${shm_free_mib:-no} MiB free" | tee -a "$out/summary.txt"
fi

# 4. tokens-to-quality against the batch (issue 25): the Debian corpus (benchmarks/debian_corpus.py,
# built where a registry is reachable and carried here: CORPUS=path/corpus.txt.xz) sharded here, then
# small at each of CONV_BATCHES rows (the product's rate rule) over one token budget, as recipes of the
# time-to-target benchmark
if in_part convergence && [ -n "${CORPUS:-}" ]; then
    corpus=$(plain_corpus "$CORPUS" corpus)
    step corpus_shards 60 $py -m jobs.cli shard --input "$corpus" --output "$work/corpus_shards" \
        heldout_fraction=0.005 progress=false
    # CONV_PREVIOUS: a time_to_target.json of earlier runs of the same CONV_TOKENS to complete, not rerun
    if [ "$device" = cuda ]; then conv=(--device cuda --preset small --workers 1 --tokens "${CONV_TOKENS:-30000000}" --log-every 100)
    else conv=(--preset tiny --workers 1 --tokens "${CONV_TOKENS:-20000}" --evals 2 --eval-batches 2); fi
    conv_recipes=()
    for rows in $(echo "${CONV_BATCHES:-128,512,2048}" | tr , ' '); do conv_recipes+=(--recipe "batch-$rows: batch_size=$rows"); done
    [ -n "${CONV_PREVIOUS:-}" ] && conv+=(--previous "$CONV_PREVIOUS")
    step convergence 420 $py benchmarks/time_to_target.py --shards "$work/corpus_shards" --seeds 0 \
        --out "$out/convergence" --log-dir "$logs/convergence" "${conv[@]}" "${conv_recipes[@]}" --orders 3
    # the paper's budget from those curves (issue 35 item 5): 10 epochs of the 1B Word Benchmark on 8
    # GPUs; the step table this session measured when it ran PART=bench, else the H100's in the docs
    steps_json=(); [ -f "$logs/train_step.json" ] && steps_json=(--step-json "$logs/train_step.json")
    step paper_budget 20 $py benchmarks/paper_budget.py --curves "$out/convergence/time_to_target.json" "${steps_json[@]}"
fi

# 6. the reference model (issues 35, 52): the preset's recipe (REF_RECIPE: more overrides) on the corpus
# without the probe's sentences, trained for a time budget (REF_BUDGET, default 5m: the run plans its
# steps to end on time, exported) through the time-to-target benchmark, its curve beside the previous
# default's (REF_PREVIOUS, benchmarks/results/) and the split's Kneser-Ney 3- and 5-gram; then what its
# layers know (the probe with its random control) and an embedding run of 50,000 lines. The shard
# stage uses its default vocabulary (min_count=3: rare words left to a <UNK> the model learns, issue
# 61) and counts the 3- and 5-gram before the run (no training time spent)
if in_part reference && [ -n "${REF_CORPUS:-}" ]; then
    mkdir -p "$out/reference"
    ref_corpus=$(plain_corpus "$REF_CORPUS" ref_corpus)
    step ref_shards 90 $py -m jobs.cli shard --input "$ref_corpus" --output "$work/ref_shards" \
        heldout_fraction=0.005 'kneser_ney_orders=[3,5]' progress=false
    # REF_BUDGET: the training run's seconds, its start-up, final evaluation and export included
    if [ "$device" = cuda ]; then
        ref_budget=${REF_BUDGET:-300}
        ref=(--device cuda --preset small --time-budget "${ref_budget}s" --eval-every "${REF_EVAL_EVERY:-600}" --log-every 100)
    else
        ref_budget=${REF_BUDGET:-40}
        ref=(--preset tiny --time-budget "${ref_budget}s" --eval-every "${REF_EVAL_EVERY:-20}" --eval-batches 5)
    fi
    # the default of before the recipe study (issue 52's H200 measurement), drawn beside the candidate
    ref_previous=(--previous "${REF_PREVIOUS:-benchmarks/results/reference-default-h200-2026-11-28.json}")
    # the run plans itself to its budget; 60 s more for the benchmark's start and its end
    step ref_train $((ref_budget + 60)) $py benchmarks/time_to_target.py --shards "$work/ref_shards" \
        --out "$out/reference" --keep "$work/ref_runs" --log-dir "$logs/ref_train" --workers 1 --seeds 0 \
        --orders 3,5 "${ref[@]}" "${ref_previous[@]}" --recipe "candidate: ${REF_RECIPE:-}"
    run_dir=$work/ref_runs/candidate-seed0
    cp "$run_dir/metrics.jsonl" "$run_dir/perplexity.png" "$out/reference/" 2>/dev/null
    model=$run_dir/export
    # (no wandb run: its files would go to OUT, whose files come back 2 folders deep at most)
    step ref_probe 100 $py -m jobs.cli probe --model "$model" --output "$out/reference/probe" --control \
        wandb.mode=disabled
    head -n 50000 "$ref_corpus" >"$work/ref_slice.txt"
    step ref_embed 45 $py -m jobs.cli embed --model "$model" --input "$work/ref_slice.txt" \
        --output "$work/ref_embed" --layers top --dtype float16 progress=false
fi

# 7. two recipes at equal minutes (PART=recipe; REC_A / REC_B: 'NAME: key=value ...', REC_BUDGET each)
# on the reference corpus, as time-to-target measures them
if in_part recipe && [ -n "${REF_CORPUS:-}" ]; then
    ref_corpus=$(plain_corpus "$REF_CORPUS" ref_corpus)
    step rec_shards 90 $py -m jobs.cli shard --input "$ref_corpus" --output "$work/rec_shards" \
        heldout_fraction=0.005 'kneser_ney_orders=[3,5]' progress=false
    # REC_B's default: bilm-tf's recipe at the GPU's rate rule (the product's GPU default before the study)
    if [ "$device" = cuda ]; then
        rec=(--device cuda --preset small --time-budget "${REC_BUDGET:-3m}" --eval-every 600 --log-every 100)
        rec_b="bilm-tf@small,bilm-tf: optimizer.lr_rule=sqrt"
    else
        rec=(--preset tiny --time-budget "${REC_BUDGET:-30s}" --eval-every 20 --eval-batches 5)
        rec_b="bilm-tf@tiny,bilm-tf: batch_size=32 eval_batch_size=32 softmax.negatives=512"
    fi
    step recipe $((deadline - SECONDS - 10)) $py benchmarks/time_to_target.py --shards "$work/rec_shards" \
        --out "$out/recipe" --log-dir "$logs/recipe" --workers 1 --seeds 0 --orders 3,5 "${rec[@]}" \
        --recipe "${REC_A:-preset:}" --recipe "${REC_B:-$rec_b}"
fi

# 2. continued: small
if [ "$device" = cuda ] && in_part bench && [ "${SMALL:-0}" = 1 ]; then
    step bench_small 45 $py benchmarks/train_step.py --device cuda --json "$logs/train_step_small.json" \
        --presets small "${small_sizes[@]}" --modes graph --steps 10 --warmup 5
fi

in_part run && {
    echo "== held-out perplexity at the end of each run (eval rows)"
    for f in "$logs"/run_*.metrics.jsonl; do
        echo "$(basename "$f"): $(grep '"kind": "eval"' "$f" | tail -n 1)"
        $py - "$f" <<'PYEOF'
import json, sys
for row in map(json.loads, open(sys.argv[1])):
    if "guard/perplexity_fwd" in row or row.get("kind") == "guard":
        print(f"  {row['kind']:5} step {row['step']:4}: full-softmax guard fwd {row['guard/perplexity_fwd']:,.1f} "
              f"bwd {row['guard/perplexity_bwd']:,.1f} {row.get('message', '')}")
# the loop's wall time per step (the rows' time: evaluations, checkpoints and logging included) against
# the steps' own (tokens/s counts only them), per attempt (time restarts at a resume)
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"]
runs = []
for row in rows:
    if runs and row["time"] > runs[-1][-1]["time"] and row["step"] > runs[-1][-1]["step"]:
        runs[-1].append(row)
    else:
        runs.append([row])
for run in runs:
    if len(run) > 1:
        wall = (run[-1]["time"] - run[0]["time"]) / (run[-1]["step"] - run[0]["step"])
        tokens = sorted(r["train/tokens_per_s"] for r in run[1:])[len(run[1:]) // 2]
        saves = sum(r.get("checkpoint/save_s", 0.0) for r in run[1:])
        print(f"  steps {run[0]['step']}-{run[-1]['step']}: {wall * 1e3:,.1f} ms per step of loop time; "
              f"median {tokens:,.0f} tokens/s of the steps; {saves:.2f} s in checkpoint saves")
PYEOF
        echo "  $(grep -c '"event": "resume"' "$f") resume event(s); train rows at steps $(grep -o '"kind": "train", "step": [0-9]*' "$f" | grep -o '[0-9]*$' | tr '\n' ' ')"
    done
} >>"$out/summary.txt"
gzip -f "$logs"/profile/*.json 2>/dev/null
tar czf "$out/logs.tar.gz" -C "$work" logs
rm -rf "$work"
echo "=== done ($(date +%T))"

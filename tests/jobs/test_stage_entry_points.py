"""The stage entry points' own parts (jobs/shard.py, jobs/train.py, jobs/embed.py): each flag lands on
its config key, key=value overrides win, and the train summary says where the run is. Running them
is test_cli.py's and the stages' tests' part."""

from __future__ import annotations

import pytest

from jobs import embed, shard, train
from jobs.stage_args import parse_stage_args, resolve
from pipeline.embed.config import EmbedConfig, LayerMode, StoredDType
from pipeline.shard.config import ShardConfig
from pipeline.train.config import TrainConfig


def config(module, schema, argv, preset=None):
    return resolve(parse_stage_args(module.build_parser(), argv), schema, module.FLAGS, preset=preset)


def test_every_shard_flag_lands_on_its_key():
    cfg = config(shard, ShardConfig, ["--input", "a.txt", "s3://b/c.gz", "--heldout-input", "h.txt",
                                      "--output", "s3://b/out", "--workers", "3"])  # fmt: skip
    assert (list(cfg.input), list(cfg.heldout_input), cfg.output, cfg.workers) == (
        ["a.txt", "s3://b/c.gz"], ["h.txt"], "s3://b/out", 3,
    )  # fmt: skip


def test_every_train_flag_lands_on_its_key_after_the_preset():
    argv = ["--shards", "s", "--output", "o", "--workers", "2", "--max-steps", "50", "--name", "r1"]
    args = parse_stage_args(train.build_parser(), [*argv, "--preset", "tiny", "optimizer.lr=0.5"])
    cfg = resolve(args, TrainConfig, train.FLAGS, preset=args.preset)
    assert (cfg.shards, cfg.output, cfg.workers, cfg.max_steps, cfg.name) == ("s", "o", 2, 50, "r1")
    assert cfg.model.lstm.projection_dim == 64 and cfg.optimizer.lr == 0.5  # tiny's, then the override


def test_every_embed_flag_lands_on_its_key():
    cfg = config(embed, EmbedConfig, ["--model", "m", "--input", "a.txt", "--output", "v.hdf5", "--layers", "top",
                                      "--dtype", "float16", "--workers", "2", "--overwrite", "--stateful",
                                      "lines_per_shard=64"])  # fmt: skip
    assert (cfg.model, list(cfg.input), cfg.output, cfg.workers) == ("m", ["a.txt"], "v.hdf5", 2)
    assert (cfg.layers, cfg.dtype, cfg.overwrite, cfg.stateful) == (
        LayerMode.top,
        StoredDType.float16,
        True,
        True,
    )
    by_files = config(
        embed, EmbedConfig, ["--options", "o.json", "--weights", "w.hdf5", "--input", "a", "--output", "o"]
    )
    assert (by_files.options_file, by_files.weights_file, by_files.model) == ("o.json", "w.hdf5", "")
    with pytest.raises(SystemExit):  # argparse: a layer mode that does not exist
        parse_stage_args(embed.build_parser(), ["--layers", "middle"])


def test_the_train_summary_says_where_the_run_is_and_how_to_upload_it():
    from pipeline.stage import StageResult, closing_lines
    from pipeline.train.launch import TrainDetails
    from pipeline.train.stage import TRAIN

    final = {"step": 400, "eval/perplexity": 98.449, "eval/perplexity_fwd": 97.94, "eval/perplexity_bwd": 98.96,
             "eval/unigram_perplexity": 346.09}  # fmt: skip
    details = TrainDetails(final, "runs/demo/train/export", "p.png", "metrics.jsonl")
    result = StageResult("train", "runs/demo/train", 60.0, 1000, details)
    assert closing_lines(TRAIN, None, result) == (
        "trained to step 400: held-out perplexity 98.45 (fwd 97.94, bwd 98.96; unigram 346.09); "
        "run directory runs/demo/train"
    )
    result.wandb_sync = "wandb sync --id x ..."
    offline = closing_lines(TRAIN, None, result)
    assert offline.splitlines()[1] == "  wandb: offline; upload it with: wandb sync --id x ..."

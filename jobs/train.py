"""``elmo train`` / ``python -m jobs.train``: pretrain the biLM on Ray Train.

    python -m jobs.train --shards DIR_OR_S3 --output RUN_DIR_OR_S3 [--preset tiny|small|medium|original] \\
        [--workers N] [--max-steps N] [--name RUN_NAME] [--config FILE] [key=value ...]

Rerunning with the same ``--output`` and ``--name`` resumes from the latest checkpoint. Under
``ray job submit`` it joins the job's cluster; otherwise it starts an embedded one.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.stage_args import parse_stage_args, preset_arg, resolve, run_main, stage_parser
from pipeline.train.progress import baselines_text

FLAGS = {
    "shards": "shards",
    "output": "output",
    "workers": "workers",
    "max_steps": "max_steps",
    "name": "name",
}
"""argparse destination -> TrainConfig key."""


def build_parser():
    parser = stage_parser(
        "elmo train", "Pretrain the biLM with Ray Train (DDP); log perplexity, checkpoint, export."
    )
    parser.add_argument("--shards", metavar="DIR_OR_S3", help="shard directory written by 'elmo shard'")
    parser.add_argument(
        "--output", metavar="RUN_DIR_OR_S3", help="run directory: metrics, plot, checkpoints, export/"
    )
    parser.add_argument(
        "--preset",
        type=preset_arg,
        help="model size and recipe from pipeline/presets/ (a recipe may follow: small,bilm-tf)",
    )
    parser.add_argument("--workers", type=int, metavar="N", help="Ray Train workers (DDP ranks)")
    parser.add_argument(
        "--max-steps", dest="max_steps", type=int, metavar="N", help="stop after N steps (0 = n_epochs)"
    )
    parser.add_argument("--name", metavar="RUN_NAME", help="run name; rerun with the same name to resume")
    return parser


def summary(final: dict, run_dir: str) -> str:
    """The end-of-run held-out perplexities and where the run landed; for an offline wandb run, a
    second line with the command that uploads it."""
    line = (
        f"trained to step {final.get('step')}: held-out perplexity {final['eval/perplexity']:.2f} "
        f"(fwd {final['eval/perplexity_fwd']:.2f}, bwd {final['eval/perplexity_bwd']:.2f}; "
        f"{baselines_text(final)}); run directory {run_dir}"
    )
    if final.get("wandb_sync"):
        line += f"\nwandb (offline) uploads with: {final['wandb_sync']}"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    def body() -> int:
        # torch and Ray only once the arguments parse
        from pipeline.runtime.ray_runtime import RaySession
        from pipeline.train.config import TrainConfig
        from pipeline.train.launch import prepare_run, run_training

        cfg = resolve(args, TrainConfig, FLAGS, preset=args.preset)
        plan = prepare_run(cfg)  # bad input fails here, before a cluster starts
        with RaySession(cfg.ray_address or None) as session:
            result = run_training(cfg, plan, session)
        print(summary(result.details, result.output))
        return 0

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

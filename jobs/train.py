"""``elmo train`` / ``python -m jobs.train``: pretrain the biLM on Ray Train.

    python -m jobs.train --shards DIR_OR_S3 --output RUN_DIR_OR_S3 [--preset tiny|small|medium|original] \\
        [--workers N] [--max-steps N] [--name RUN_NAME] [--config FILE] [key=value ...]

Rerunning with the same ``--output`` and ``--name`` resumes from the latest checkpoint. Under
``ray job submit`` it joins the job's cluster; otherwise it starts an embedded one.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.stage_args import parse_stage_args, preset_arg, resolve, run_main, same_keys, stage_parser

FLAGS = same_keys("shards", "output", "workers", "max_steps", "name")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    def body() -> int:
        # torch and Ray only once the arguments parse
        from pipeline.stage import run_alone
        from pipeline.train.stage import TRAIN

        run_alone(TRAIN, resolve(args, TRAIN.schema, FLAGS, preset=args.preset))
        return 0

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

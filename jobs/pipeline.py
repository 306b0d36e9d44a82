"""``elmo pipeline`` / ``python -m jobs.pipeline``: shard -> train -> evaluate -> export -> embed -> probe.

    python -m jobs.pipeline [--preset tiny] [--config FILE] [storage=DIR_OR_S3] [name=RUN] [key=value ...]

With no arguments this is ``make demo``: the shipped sample corpus, the tiny preset, an embedded
Ray cluster, local storage under ``runs/``, wandb offline.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jobs.stage_args import parse_stage_args, preset_arg, run_main, stage_parser
from pipeline.config import resolve_config


def build_parser():
    parser = stage_parser("elmo pipeline", "Run the whole pipeline end to end (what `make demo` runs).")
    parser.add_argument(
        "--preset",
        type=preset_arg,
        default="tiny",
        help="model size for training (default tiny; a recipe may follow: small,bilm-tf)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    from pipeline.end_to_end.config import PipelineConfig
    from pipeline.end_to_end.job import run_pipeline, summary

    def body() -> int:
        cfg = resolve_config(
            PipelineConfig,
            config_file=args.config,
            overrides=args.overrides,
            preset=args.preset,
            allow_missing=True,
        )
        print(summary(run_pipeline(cfg)))
        return 0

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())

"""``elmo config STAGE [--preset NAME] [--config FILE] [key=value ...]``: print a resolved config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jobs.stage_args import add_config_args, main_argv, run_main
from jobs.stages import STAGES, stage_schema
from pipeline.config import resolve_config, to_yaml


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="elmo config",
        description="Print the resolved config of a stage (schema, preset, file, overrides).",
    )
    # the stage must come before the key=value list, so it is declared first
    parser.add_argument("stage", choices=list(STAGES), help="which stage's config")
    parser.add_argument("--preset", help="model size preset from pipeline/presets/ (train, pipeline)")
    add_config_args(parser)
    args = parser.parse_intermixed_args(main_argv(argv))

    def body() -> int:
        cfg = resolve_config(
            stage_schema(args.stage),
            config_file=args.config,
            overrides=args.overrides,
            preset=args.preset,
            allow_missing=True,
        )
        sys.stdout.write(to_yaml(cfg))
        return 0

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())

"""``elmo shard`` / ``python -m jobs.shard``: raw corpus -> vocabulary + WebDataset shards + manifest.

    python -m jobs.shard --input PATHS_OR_GLOBS... --output DIR_OR_S3 [--workers N] \\
        [--config FILE] [key=value ...]

Rerunning over a complete output does nothing; over a partial one (a killed run) it completes it.
Under ``ray job submit`` it joins the job's cluster; otherwise it starts an embedded one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jobs.stage_args import parse_stage_args, resolve, run_main, same_keys, stage_parser

FLAGS = same_keys("input", "heldout_input", "output", "workers")
"""argparse destination -> ShardConfig key."""


def build_parser():
    parser = stage_parser(
        "elmo shard", "Tokenize a corpus, build the vocabulary and write WebDataset shards."
    )
    parser.add_argument(
        "--input", nargs="+", metavar="PATH", help="input files or globs, local or s3:// (plain or .gz)"
    )
    parser.add_argument(
        "--heldout-input", dest="heldout_input", nargs="+", metavar="PATH", help="inputs held out entirely"
    )
    parser.add_argument("--output", metavar="DIR_OR_S3", help="output directory or s3:// prefix")
    parser.add_argument("--workers", type=int, metavar="N", help="Ray tasks at once (0 = all CPUs)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    def body() -> int:
        # Ray only once the arguments parse
        from pipeline.shard.stage import SHARD
        from pipeline.stage import run_alone

        run_alone(SHARD, resolve(args, SHARD.schema, FLAGS))
        return 0

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())

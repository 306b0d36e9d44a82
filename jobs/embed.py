"""``elmo embed`` / ``python -m jobs.embed``: embed a corpus with a biLM into HDF5 or Parquet shards
(``format=``), or one AllenNLP HDF5 file.

    python -m jobs.embed --model DIR_OR_S3 --input PATHS --output DIR_OR_S3_PREFIX \\
        [--layers all|top|average] [--dtype float32|float16] [--workers N] [--stateful] \\
        [--overwrite] [--config FILE] [key=value ...]

``--options F --weights F`` name the model files one by one instead of ``--model``. Under
``ray job submit`` it joins the job's cluster; otherwise it starts an embedded one.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.stage_args import (
    MODEL_FLAGS,
    add_model_flags,
    add_switch,
    parse_stage_args,
    resolve,
    run_main,
    same_keys,
    stage_parser,
)
from pipeline.config import choices
from pipeline.embed.config import EmbedConfig, LayerMode, StoredDType

FLAGS = {**MODEL_FLAGS, **same_keys("input", "output", "layers", "dtype", "workers", "stateful", "overwrite")}
"""argparse destination -> EmbedConfig key."""


def build_parser():
    parser = stage_parser(
        "elmo embed", "Embed a corpus with a biLM into HDF5 or Parquet shards (format=), resumably."
    )
    add_model_flags(parser)
    parser.add_argument(
        "--input",
        nargs="+",
        metavar="PATH",
        help="text files / globs (one tokenized sentence per line) or a shard directory",
    )
    parser.add_argument(
        "--output",
        metavar="DIR_OR_S3_PREFIX",
        help="output folder / s3 prefix, or a .hdf5 file for single-file mode",
    )
    add_switch(
        parser,
        "--overwrite",
        "single-file mode: replace an existing .hdf5 output (a folder is never overwritten)",
    )
    parser.add_argument("--layers", choices=choices(LayerMode), help="all (default), top or average")
    parser.add_argument("--dtype", choices=choices(StoredDType), help="stored dtype (default float32)")
    parser.add_argument("--workers", type=int, metavar="N", help="embedding actors (default 1)")
    add_switch(parser, "--stateful", "carry LSTM state across batches in input order (original behaviour)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    def body() -> int:
        from pipeline.embed.stage import EMBED  # torch and Ray only once the arguments parse
        from pipeline.stage import run_alone

        result = run_alone(EMBED, resolve(args, EmbedConfig, FLAGS))
        return 0 if result.complete else 3

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

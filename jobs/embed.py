"""``elmo embed`` / ``python -m jobs.embed``: embed a corpus with a biLM into sharded HDF5 (or one file).

    python -m jobs.embed --model DIR_OR_S3 --input PATHS --output DIR_OR_S3_PREFIX \\
        [--layers all|top|average] [--dtype float32|float16] [--workers N] [--stateful] \\
        [--overwrite] [--config FILE] [key=value ...]

``--options F --weights F`` name the model files one by one instead of ``--model``. Under
``ray job submit`` it joins the job's cluster; otherwise it starts an embedded one.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.stage_args import parse_stage_args, resolve, run_main, stage_parser
from pipeline.config import choices
from pipeline.embed.config import EmbedConfig, LayerMode, StoredDType

FLAGS = {
    "model": "model",
    "options": "options_file",
    "weights": "weights_file",
    "input": "input",
    "output": "output",
    "layers": "layers",
    "dtype": "dtype",
    "workers": "workers",
    "stateful": "stateful",
    "overwrite": "overwrite",
}
"""argparse destination -> EmbedConfig key."""


def build_parser():
    parser = stage_parser("elmo embed", "Embed a corpus with a biLM into HDF5 (AllenNLP layout), resumably.")
    parser.add_argument("--model", metavar="DIR_OR_S3", help="folder with options.json + weights.hdf5")
    parser.add_argument("--options", metavar="F", help="options.json (with --weights, instead of --model)")
    parser.add_argument("--weights", metavar="F", help="weights HDF5 (with --options)")
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
    parser.add_argument(
        "--overwrite",
        action="store_const",
        const=True,
        help="single-file mode: replace an existing .hdf5 output (a folder is never overwritten)",
    )
    parser.add_argument("--layers", choices=choices(LayerMode), help="all (default), top or average")
    parser.add_argument("--dtype", choices=choices(StoredDType), help="stored dtype (default float32)")
    parser.add_argument("--workers", type=int, metavar="N", help="embedding actors (default 1)")
    parser.add_argument(
        "--stateful",
        action="store_const",
        const=True,
        help="carry LSTM state across batches in input order (original behaviour)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    def body() -> int:
        from pipeline.embed.runner import run_embed, summary  # torch and Ray only once the arguments parse
        from pipeline.runtime.ray_runtime import RaySession

        cfg = resolve(args, EmbedConfig, FLAGS)
        with RaySession(cfg.ray_address or None, cfg.num_cpus or None) as session:
            result = run_embed(cfg, session)
        print(summary(result))
        return 0 if result.complete else 3

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

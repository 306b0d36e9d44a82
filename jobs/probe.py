"""``elmo probe`` / ``python -m jobs.probe``: what each layer of a trained biLM knows.

    python -m jobs.probe --model DIR_OR_S3 --output DIR_OR_S3 [--control] [--config FILE] [key=value ...]

Part of speech (a linear classifier per layer and a learned mix, Brown) and word sense (the nearest
sense centroid per layer, WordNet 3.0's examples), against their baselines; ``probe.json`` and
``probe.png`` in the output. One process: no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.stage_args import parse_stage_args, resolve, run_main, stage_parser
from pipeline.probe.config import ProbeConfig

FLAGS = {
    "model": "model",
    "options": "options_file",
    "weights": "weights_file",
    "output": "output",
    "control": "control",
}
"""argparse destination -> ProbeConfig key."""


def build_parser():
    parser = stage_parser(
        "elmo probe", "What each layer of a trained biLM knows: part of speech and word sense."
    )
    parser.add_argument("--model", metavar="DIR_OR_S3", help="folder with options.json + weights.hdf5")
    parser.add_argument("--options", metavar="F", help="options.json (with --weights, instead of --model)")
    parser.add_argument("--weights", metavar="F", help="weights HDF5 (with --options)")
    parser.add_argument("--output", metavar="DIR_OR_S3", help="folder for probe.json and probe.png")
    parser.add_argument(
        "--control",
        action="store_const",
        const=True,
        help="probe a randomly initialised model of the same size too (what pretraining bought)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_stage_args(build_parser(), argv)

    def body() -> int:
        from pipeline.probe.runner import run_probe, summary  # torch only once the arguments parse

        print(summary(run_probe(resolve(args, ProbeConfig, FLAGS))))
        return 0

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

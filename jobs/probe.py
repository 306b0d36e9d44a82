"""``elmo probe`` / ``python -m jobs.probe``: what each layer of a trained biLM knows.

    python -m jobs.probe --model DIR_OR_S3 --output DIR_OR_S3 [--control] [--config FILE] [key=value ...]

Part of speech (a linear classifier per layer and a learned mix, Brown) and word sense (the nearest
sense centroid per layer, WordNet 3.0's examples), against their baselines; ``probe.json`` and
``probe.png`` in the output. One process: no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs import stage_args
from pipeline.probe.config import ProbeConfig

FLAGS = {**stage_args.MODEL_FLAGS, **stage_args.same_keys("output", "control")}
"""argparse destination -> ProbeConfig key."""


def build_parser():
    parser = stage_args.stage_parser(
        "elmo probe", "What each layer of a trained biLM knows: part of speech and word sense."
    )
    stage_args.add_model_flags(parser)
    parser.add_argument("--output", metavar="DIR_OR_S3", help="folder for probe.json and probe.png")
    stage_args.add_switch(
        parser,
        "--control",
        "probe a randomly initialised model of the same size too (what pretraining bought)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = stage_args.parse_stage_args(build_parser(), argv)

    def body() -> int:
        from pipeline.probe.stage import PROBE  # torch only once the arguments parse
        from pipeline.stage import run_alone

        run_alone(PROBE, stage_args.resolve(args, ProbeConfig, FLAGS))
        return 0

    return stage_args.run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

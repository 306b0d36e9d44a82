"""``elmo export CHECKPOINT OUT``: write a training checkpoint as options.json + weights.hdf5
(bilm-tf / AllenNLP format), softmax.hdf5 and vocab.txt.

CHECKPOINT is a checkpoint directory (``RUN/checkpoints/step-...``) or a run directory (its latest
checkpoint); both may be local or ``s3://``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from jobs.stage_args import add_switch, main_argv, run_main
from pipeline.runtime import storage


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="elmo export", description="Export a training checkpoint in the original format."
    )
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="checkpoint directory or run directory (local or s3://)"
    )
    parser.add_argument("out", metavar="OUT", help="output directory (local or s3://)")
    parser.add_argument("--endpoint", metavar="URL", help="S3 endpoint (default AWS_ENDPOINT_URL)")
    add_switch(
        parser,
        "--overwrite",
        "write into a folder that holds other files (its export files are replaced, the rest kept)",
    )
    args = parser.parse_args(main_argv(argv))

    def body() -> int:
        from pipeline.train.export import export_checkpoint

        if args.endpoint:
            storage.configure(endpoint_url=args.endpoint)
        written = export_checkpoint(args.checkpoint.rstrip("/"), args.out.rstrip("/"), bool(args.overwrite))
        print("wrote " + ", ".join(written))
        return 0

    return run_main(body)


if __name__ == "__main__":
    raise SystemExit(main())

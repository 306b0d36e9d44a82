"""The ``elmo`` command: one subcommand per stage, each delegating to ``jobs.<stage>.main``.

Subcommands are imported only when chosen, so ``elmo --help`` and ``elmo config shard`` answer
without importing torch or starting Ray.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "shard": ("jobs.shard", "tokenize a corpus, build the vocabulary, write WebDataset shards + manifest"),
    "train": ("jobs.train", "pretrain the biLM with Ray Train (DDP), log perplexity, checkpoint, export"),
    "embed": ("jobs.embed", "embed a corpus in bulk with Ray Data into HDF5 or Parquet shards on storage"),
    "pipeline": ("jobs.pipeline", "run shard -> train -> evaluate -> export -> embed -> probe end to end"),
    "export": ("jobs.export", "export a training checkpoint as options.json + weights.hdf5"),
    "probe": ("jobs.probe", "what each layer of a trained biLM knows: part of speech and word sense"),
    "config": ("jobs.config", "print the resolved config of a stage as YAML"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: elmo COMMAND [--config FILE] [flags] [key=value ...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run 'elmo COMMAND --help' for the flags of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The command-line shape every stage shares: ``--config FILE``, stage flags, then ``key=value``.

Stage flags (``--input``, ``--workers`` ...) are sugar for overrides: each flag maps to a config
key, and flags are applied after the config file but before the explicit ``key=value`` overrides,
so the most specific thing a user typed wins.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig

from pipeline.config import load_config, preset_names
from pipeline.errors import PipelineError
from pipeline.runtime import stopping
from pipeline.runtime.redaction import redact


def stage_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with ``--config`` and trailing ``key=value`` overrides; add the stage's flags to it."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_args(parser)
    return parser


def same_keys(*names: str) -> dict[str, str]:
    """Flags named as their config keys (``--max-steps`` -> ``max_steps``)."""
    return {name: name for name in names}


def add_switch(parser: argparse.ArgumentParser, flag: str, help: str) -> None:  # noqa: A002 (argparse's word)
    """A flag without a value that sets its key true (left out: the config decides)."""
    parser.add_argument(flag, action="store_const", const=True, help=help)


MODEL_FLAGS = {"model": "model", "options": "options_file", "weights": "weights_file"}
"""The model flags of a stage that reads a trained model (embed, probe) -> its config keys."""


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """``--model DIR`` or ``--options F --weights F``: the model a stage reads (`MODEL_FLAGS`)."""
    parser.add_argument("--model", metavar="DIR_OR_S3", help="folder with options.json + weights.hdf5")
    parser.add_argument("--options", metavar="F", help="options.json (with --weights, instead of --model)")
    parser.add_argument("--weights", metavar="F", help="weights HDF5 (with --options)")


def preset_arg(text: str) -> str:
    """``--preset``'s value: a preset name, or names joined by commas (a size, then a recipe:
    ``original,bilm-tf``), each one of ``pipeline/presets/``."""
    known = preset_names()
    for name in text.split(","):
        if name.strip() not in known:
            raise argparse.ArgumentTypeError(
                f"unknown preset {name.strip()!r}; known presets: {', '.join(known)}"
            )
    return text


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` and the trailing ``key=value`` list (after any other positionals)."""
    parser.add_argument("--config", metavar="FILE", help="YAML file merged over the schema defaults")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. workers=2")


OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")
"""A ``key=value`` override: a dotted identifier, then ``=``. Paths never match (``/`` or ``:``
comes before any ``=`` in them), so overrides may stand anywhere on the command line."""


def parse_stage_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv`` with overrides taken out first, so a multi-value flag such as
    ``--input a.txt b.txt`` never swallows a ``key=value`` that follows it."""
    args = main_argv(argv)
    overrides = [a for a in args if OVERRIDE.match(a)]
    namespace = parser.parse_intermixed_args([a for a in args if not OVERRIDE.match(a)])
    namespace.overrides = list(namespace.overrides or []) + overrides
    return namespace


def flag_values(args: argparse.Namespace, flag_to_key: Mapping[str, str]) -> dict[str, Any]:
    """The flags the user gave (``None`` means not given) as their config keys and the values
    argparse made of them: ``--output 1.10`` is the string ``"1.10"``, never a number YAML read."""
    return {
        key: getattr(args, flag) for flag, key in flag_to_key.items() if getattr(args, flag, None) is not None
    }


def resolve(
    args: argparse.Namespace, schema: type, flag_to_key: Mapping[str, str], preset: str | None = None
) -> DictConfig:
    """The stage config: schema, preset, ``--config``, stage flags, then ``key=value`` overrides."""
    return load_config(
        schema,
        config_file=args.config,
        overrides=list(args.overrides),
        preset=preset,
        flags=flag_values(args, flag_to_key),
    )


def run_main(body: Callable[[], int | None]) -> int:
    """Run a stage body with the one exit-code policy of every entry point: a `PipelineError` (the
    package's one error family) prints ``error: MESSAGE`` (credentials in URLs redacted) and exits 2, Ctrl-C prints
    ``interrupted`` and exits 130, SIGTERM while Ray runs (`Terminated`) prints ``terminated`` and
    exits 143 (128 + the signal, as a shell reports it); anything else is a bug and keeps its
    traceback."""
    stopping.hear_stops()
    try:
        return int(body() or 0)
    except PipelineError as err:
        print(f"error: {redact(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as caught:  # its message, when there is one, says what a rerun continues from
        word, status = stopping.exit_status(caught)
        print(f"{word}: {caught}" if str(caught) else word, file=sys.stderr)
        return status


def main_argv(argv: Sequence[str] | None) -> list[str]:
    """``argv`` or ``sys.argv[1:]``."""
    return list(sys.argv[1:] if argv is None else argv)

"""The command line every stage shares (jobs/stage_args.py): flags as overrides, overrides anywhere,
flag values as typed, never YAML, one exit-code policy."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from jobs.stage_args import flag_values, parse_stage_args, resolve, run_main, stage_parser
from pipeline.config import ConfigError
from pipeline.errors import PipelineError, Terminated


@dataclasses.dataclass
class Schema:
    input: list[str] = dataclasses.field(default_factory=list)
    output: str = ""
    workers: int = 1
    tokenizer: str = "whitespace"


def parser() -> argparse.ArgumentParser:
    p = stage_parser("elmo test", "a stage")
    p.add_argument("--input", nargs="+")
    p.add_argument("--output")
    p.add_argument("--workers", type=int)
    return p


FLAGS = {"input": "input", "output": "output", "workers": "workers"}


def test_overrides_stand_anywhere_and_a_multi_value_flag_never_swallows_one():
    args = parse_stage_args(parser(), ["--input", "a.txt", "b.txt", "workers=3", "--output", "s3://b/x:y"])
    assert args.input == ["a.txt", "b.txt"] and args.overrides == ["workers=3"]
    assert args.output == "s3://b/x:y"  # a path is never taken for an override


def test_flag_values_are_what_argparse_made_of_them():
    args = parse_stage_args(parser(), ["--input", "corpus/*.txt", "it's,here", "--output", "s3://b/o"])
    assert flag_values(args, FLAGS) == {"input": ["corpus/*.txt", "it's,here"], "output": "s3://b/o"}
    cfg = resolve(args, Schema, FLAGS)
    assert list(cfg.input) == ["corpus/*.txt", "it's,here"] and cfg.output == "s3://b/o"


@pytest.mark.parametrize(
    "path",
    [
        "1.10",
        "1.1",
        "0123",
        "0x1F",
        "1e3",
        "yes",
        "off",
        "null",
        "@c300.txt",
        "!x",
        "%41",
        "`x",
        "[a]",
        "a: b",
    ],
)
def test_a_flags_value_is_the_string_typed_never_yaml(path):
    """Issue 65, item 1: ``--output 0123`` wrote into ``83`` and ``--input 1.10`` read ``1.1``."""
    args = parse_stage_args(parser(), ["--input", path, "--output", path, "--workers", "3"])
    cfg = resolve(args, Schema, FLAGS)
    assert (list(cfg.input), cfg.output, cfg.workers) == ([path], path, 3)


def test_a_value_yaml_cannot_read_is_one_line_naming_its_key():
    for item in ["output=@x", "output=`x", "output=%41", "output=!!python/object:os.system x"]:
        args = parse_stage_args(parser(), ["--input", "a", item])
        with pytest.raises(ConfigError, match=r"^cannot read the value of config key 'output' \(") as err:
            resolve(args, Schema, FLAGS)
        assert "\n" not in str(err.value)
    args = parse_stage_args(parser(), ["--input", "a", "output='@x'"])  # quoted: the literal string
    assert resolve(args, Schema, FLAGS).output == "@x"


def test_the_most_specific_setting_wins(tmp_path):
    config = tmp_path / "stage.yaml"
    config.write_text("workers: 2\ntokenizer: moses\n")
    args = parse_stage_args(parser(), ["--config", str(config), "--workers", "4", "workers=8"])
    cfg = resolve(args, Schema, FLAGS)
    assert (cfg.workers, cfg.tokenizer) == (8, "moses")  # file < flag < key=value
    assert (
        resolve(
            parse_stage_args(parser(), ["--config", str(config), "--workers", "4"]), Schema, FLAGS
        ).workers
        == 4
    )


def _raise(error: BaseException):
    def body():
        raise error

    return body


def test_one_exit_code_policy_for_every_entry_point(capsys):
    assert run_main(lambda: None) == 0 and run_main(lambda: 3) == 3
    assert run_main(_raise(PipelineError("input s3://user:secret@host/b is empty"))) == 2
    assert capsys.readouterr().err == "error: input s3://***@host/b is empty\n"  # credentials redacted
    assert run_main(_raise(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert run_main(_raise(Terminated())) == 143
    assert capsys.readouterr().err == "terminated\n"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        run_main(lambda: 1 / 0)

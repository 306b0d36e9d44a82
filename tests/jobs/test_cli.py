"""The `elmo` command: stage listing, `elmo config`, and one-line errors (in a real subprocess)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.subprocess

ELMO = str(Path(sys.executable).parent / "elmo")


def _elmo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ELMO, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_stage():
    result = _elmo("--help")
    assert result.returncode == 0
    for stage in ("shard", "train", "embed", "pipeline", "config", "export", "probe"):
        assert f"\n  {stage} " in result.stdout


def test_config_train_prints_the_resolved_yaml():
    result = _elmo("config", "train", "--preset", "tiny", "workers=3", "shards=/data/shards")
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["workers"] == 3 and cfg["shards"] == "/data/shards"
    assert cfg["model"]["lstm"]["projection_dim"] == 64  # from the tiny preset


def test_misspelled_workers_key_is_one_line_with_a_suggestion():
    result = _elmo("config", "train", "wokrers=2")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "'wokrers'" in result.stderr and "did you mean 'workers'" in result.stderr


@pytest.mark.parametrize(
    "stage, override, message",
    [
        ("train", "max_steps=-1", "'max_steps' must be in [0, 2**63 - 1]"),
        ("train", "optimizer.lr=nan", "'optimizer.lr' must be a number > 0, got nan"),
        ("train", "batch_size=0", "'batch_size' must be >= 1"),
        ("train", "checkpoint_every=-3", "'checkpoint_every' must be >= 1"),
        ("train", "keep_checkpoints=0", "'keep_checkpoints' must be >= 1"),
        ("train", "seed=99999999999999999999999", "'seed' must be in [0, 2**63 - 1]"),
        ("shard", "seed=-1", "'seed' must be in [0, 2**63 - 1]"),
        ("pipeline", "name=../escape", "'name' must be one folder name"),
    ],
)
def test_config_refuses_what_the_stage_refuses(stage, override, message):
    # unset keys (the train stage's shards and output) do not stop the rules being checked
    result = _elmo("config", stage, override)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr


def test_unknown_command_is_one_line():
    result = _elmo("shardd")
    assert result.returncode == 2 and "unknown command 'shardd'" in result.stderr


def test_stage_flags_and_overrides_mix_in_any_order(tmp_path):
    from jobs import shard
    from jobs.stage_args import parse_stage_args, resolve
    from pipeline.shard.config import ShardConfig

    args = parse_stage_args(
        shard.build_parser(), ["--input", "a.txt", "b.txt", "min_count=2", "--output", "s3://b/o"]
    )
    cfg = resolve(args, ShardConfig, shard.FLAGS)
    assert list(cfg.input) == ["a.txt", "b.txt"] and cfg.min_count == 2 and cfg.output == "s3://b/o"


def _raise(error: BaseException):
    def body():
        raise error

    return body


def test_every_entry_point_reports_errors_interrupts_and_sigterm_by_one_policy(capsys):
    from jobs.stage_args import run_main
    from pipeline.errors import PipelineError, Terminated

    endings = [
        (PipelineError("shards: no such directory /x"), 2, "error: shards: no such directory /x"),
        (KeyboardInterrupt(), 130, "interrupted"),
        (Terminated(), 143, "terminated"),
        (Terminated("stopped at step 7; checkpoint C"), 143, "terminated: stopped at step 7; checkpoint C"),
        (KeyboardInterrupt("stopped at step 3"), 130, "interrupted: stopped at step 3"),
    ]
    for error, status, line in endings:
        assert run_main(_raise(error)) == status
        assert capsys.readouterr().err.strip() == line
    assert run_main(lambda: None) == 0


def test_sigint_is_heard_from_the_first_moment_even_when_the_shell_ignored_it():
    """A command started with `&` by a script inherits SIGINT ignored; the entry point hears it
    anyway (Ray Train would, once training started: one meaning for the whole run). The body
    signals itself: a SIGINT that is lost leaves it sleeping past the timeout."""
    body = (
        "import os, signal, time; from jobs.stage_args import run_main; "
        "raise SystemExit(run_main(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(60))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", body],
        capture_output=True,
        text=True,
        timeout=20,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert result.returncode == 130 and result.stderr.strip() == "interrupted", result.stderr

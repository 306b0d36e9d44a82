"""Where a wandb run's offline files go, and the command that uploads them."""

from __future__ import annotations

import os

from pipeline.tracking.offline_files import RUNS_PATTERN, new_wandb_id, next_attempt, sync_command


def test_ids_are_wandb_ids():
    ids = {new_wandb_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 12 and i.isalnum() and i.islower() for i in ids)


def test_sync_commands():
    assert sync_command("/runs/a b/wandb", "abc123", "elmo") == (
        "wandb sync --id abc123 -p elmo '/runs/a b/wandb'/attempt-*/wandb/offline-run-*-abc123"
    )
    assert sync_command("s3://bucket/runs/x/wandb", "abc123", "elmo", "team") == (
        "aws s3 cp --recursive s3://bucket/runs/x/wandb ./wandb-abc123 && "
        "wandb sync --id abc123 -p elmo -e team ./wandb-abc123/attempt-*/wandb/offline-run-*-abc123"
    )


def test_attempts_are_numbered_past_the_highest_left(tmp_path):
    folder = str(tmp_path / "out" / "wandb")
    assert next_attempt(folder) == os.path.join(folder, "attempt-001")
    os.makedirs(os.path.join(folder, "attempt-007"))
    assert next_attempt(folder) == os.path.join(folder, "attempt-008")
    assert sorted(os.listdir(folder)) == ["attempt-001", "attempt-007", "attempt-008"]


def test_an_outputs_own_files_pattern_takes_its_runs_and_nothing_beside():
    import re

    pattern = re.compile(RUNS_PATTERN)
    assert pattern.fullmatch("wandb/attempt-001/wandb/offline-run-20261128_060000-abc/run-abc.wandb")
    assert not pattern.fullmatch("wandb/notes.txt")
    assert not pattern.fullmatch("wandb/attempt-001")

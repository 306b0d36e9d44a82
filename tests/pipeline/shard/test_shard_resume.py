"""What a rerun of the shard stage finds in its output (pipeline/shard/resume.py): its own plan and
vocabulary to reuse, another run's files to refuse."""

from __future__ import annotations

import pytest

from pipeline.formats.shard_format import COUNTS_FILE, VOCAB_FILE
from pipeline.formats.shard_manifest import ShardManifest
from pipeline.shard.errors import ShardError
from pipeline.shard.manifest import PLAN_FILE, RUN_FILE, build_plan, encode_json, run_identity
from pipeline.shard.resume import claim_output, inspect_output, is_complete, read_vocabulary
from pipeline.shard.vocabulary import build_vocabulary

A_TXT = {"a.txt": {"bytes": 100, "modified_ns": 1}}
IDENTITY = run_identity({"tokenizer": "moses", "seed": 3}, ["a.txt"], [], A_TXT)
VOCAB = build_vocabulary({"the": 5, "cat": 2}, num_sentences=3)


def test_a_new_output_has_nothing_and_a_killed_runs_plan_is_found(tmp_path):
    assert inspect_output(str(tmp_path / "new"), IDENTITY) == (None, None)
    claim_output(str(tmp_path), IDENTITY)
    assert (tmp_path / RUN_FILE).read_bytes() == encode_json(IDENTITY)
    (tmp_path / PLAN_FILE).write_bytes(encode_json(build_plan(IDENTITY, 1024, [], VOCAB)))
    manifest, plan = inspect_output(str(tmp_path), IDENTITY)
    assert manifest is None and plan["vocab_sha256"] == VOCAB.sha256


def test_another_runs_output_is_refused_naming_what_differs(tmp_path):
    other = run_identity({"tokenizer": "whitespace", "seed": 4}, ["b.txt"], [], {"b.txt": {}})
    claim_output(str(tmp_path), other)
    claim_output(str(tmp_path), IDENTITY)  # the first claim stands
    with pytest.raises(
        ShardError,
        match="shard_run.json belongs to a run with different inputs, seed, tokenizer; use another",
    ):
        inspect_output(str(tmp_path), IDENTITY)


def test_an_output_of_an_edited_input_is_refused_naming_the_input(tmp_path):
    before = run_identity(
        {"tokenizer": "moses", "seed": 3}, ["a.txt"], [], {"a.txt": {"bytes": 100, "modified_ns": 0}}
    )
    claim_output(str(tmp_path), before)
    with pytest.raises(ShardError, match=r"belongs to a run of other input versions \(a.txt changed since"):
        inspect_output(str(tmp_path), IDENTITY)


def test_an_unreadable_plan_means_counting_again_but_files_without_the_claim_are_refused(tmp_path):
    claim_output(str(tmp_path), IDENTITY)
    (tmp_path / PLAN_FILE).write_text("{cut off")
    assert inspect_output(str(tmp_path), IDENTITY) == (None, None)
    (tmp_path / RUN_FILE).unlink()
    (tmp_path / "train-000000.tar").write_bytes(b"someone's")
    with pytest.raises(
        ShardError, match="holds shard_plan.json but no shard_run.json: not an elmo shard output"
    ):
        inspect_output(str(tmp_path), IDENTITY)
    (tmp_path / RUN_FILE).write_text("{cut")
    with pytest.raises(ShardError, match="shard_run.json is damaged"):
        inspect_output(str(tmp_path), IDENTITY)


def test_the_vocabulary_is_reused_only_when_it_is_the_plans(tmp_path):
    assert read_vocabulary(str(tmp_path), VOCAB.sha256) is None  # not written yet
    (tmp_path / VOCAB_FILE).write_bytes(VOCAB.vocab_bytes)
    (tmp_path / COUNTS_FILE).write_bytes(VOCAB.counts_bytes)
    assert read_vocabulary(str(tmp_path), VOCAB.sha256) == VOCAB
    assert read_vocabulary(str(tmp_path), "0" * 64) is None  # another run's
    (tmp_path / COUNTS_FILE).write_text("not\ta count\n")
    assert read_vocabulary(str(tmp_path), VOCAB.sha256) is None


def test_an_output_is_complete_when_every_file_its_manifest_names_is_there(tmp_path):
    entry = {"sentences": 1, "tokens": 1, "sha256": "ab" * 32}
    total = {"sentences": 1, "tokens": 1, "unk_tokens": 0}
    record = {
        "shards": {
            "train": [{"name": "train-000000.tar", **entry}],
            "heldout": [{"name": "heldout-000000.tar", **entry}],
        },
        "totals": {"train": total, "heldout": total},
        "vocab": {"file": VOCAB_FILE, "counts_file": COUNTS_FILE, "size": 4, "sha256": "cd" * 32},
    }
    manifest = ShardManifest.of(record, str(tmp_path))
    for name in (VOCAB_FILE, COUNTS_FILE, "train-000000.tar"):
        (tmp_path / name).write_bytes(b"x")
    assert not is_complete(manifest)
    (tmp_path / "heldout-000000.tar").write_bytes(b"x")
    assert is_complete(manifest)

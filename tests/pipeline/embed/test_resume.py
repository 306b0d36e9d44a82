"""Exactly-once output (pipeline/embed/resume.py): claims, commits and what a rerun finds complete,
on a local folder (the s3 paths go through the same storage calls: test_run.py runs them on S3)."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from embed_fixtures import shard_of

from pipeline.embed import manifest, resume
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import chosen_format
from pipeline.embed.inputs import ShardSpec
from pipeline.output_folder import taken_back_on_failure

RUN = {
    "schema": manifest.SCHEMA,
    "input": "corpus.txt",
    "model_sha256": "ab" * 32,
    "layers": "all",
    "dtype": "float32",
}


def specs(count: int, lines: int = 10) -> list[ShardSpec]:
    return [ShardSpec(i, i * lines, lines, segments=(), input_sha256=f"in{i}") for i in range(count)]


PACKED = chosen_format("hdf5", "packed")


COUNTS = {key: 1 for key in manifest.COUNTED if key != "bytes"}
"""A shard's counts, as ``shard_work.shard_stats`` gives them (``bytes`` is the commit's)."""


def commit(output: str, spec: ShardSpec, fill: float = 1.0, claim: bool = True) -> dict:
    if claim and not os.path.exists(os.path.join(output, "_progress", "run.json")):
        resume.claim_output(output, RUN)  # the run's claim makes the folder: a commit never does
    shard = shard_of(spec.first_line, [np.full((2, 4), fill, dtype=np.float32)] * spec.num_lines)
    stats = {"index": spec.index, "input_sha256": spec.input_sha256, **COUNTS}
    return resume.commit_shard(output, stats, shard, PACKED)


def test_a_claim_is_written_once_and_resumed_only_with_the_same_settings(tmp_path):
    out = str(tmp_path / "emb")
    assert resume.claim_output(out, RUN) is False
    assert json.loads((tmp_path / "emb" / "_progress" / "run.json").read_text()) == RUN
    assert resume.claim_output(out, dict(RUN)) is True
    # a setting a first-schema run did not record counts as its default; in this schema it is a difference
    first = tmp_path / "first" / "_progress"
    first.mkdir(parents=True)
    recorded = {k: v for k, v in RUN.items() if k != "schema"}
    (first / "run.json").write_text(json.dumps({"format": manifest.FIRST_SCHEMA, **recorded}))
    assert resume.claim_output(str(tmp_path / "first"), {**RUN, **manifest.RUN_DEFAULTS}) is True
    with pytest.raises(EmbedError, match=r"other settings \(precision: None, now 'float32'\)"):
        resume.claim_output(out, {**RUN, "precision": "float32"})
    with pytest.raises(EmbedError, match=r"other settings \(layers: 'all', now 'top'\)"):
        resume.claim_output(out, {**RUN, "layers": "top"})
    (tmp_path / "emb" / "_progress" / "run.json").write_text("{not json")
    with pytest.raises(EmbedError, match="run.json is not an elmo embed marker"):
        resume.claim_output(out, RUN)


def test_a_shard_counts_as_complete_only_with_its_entry_its_file_and_its_input(tmp_path):
    out, shards = str(tmp_path / "emb"), specs(3)
    entry = commit(out, shards[0], 1.0)
    data = (tmp_path / "emb" / "embeddings-000000.hdf5").read_bytes()
    assert entry["name"] == "embeddings-000000.hdf5" and entry["bytes"] == len(data)
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert not [p.name for p in (tmp_path / "emb").iterdir() if p.name.endswith(".elmo-partial")]
    commit(out, shards[1], 2.0)
    # shard 2: killed between its two writes (the file is there, its entry is not)
    (tmp_path / "emb" / PACKED.file_name(2)).write_bytes(b"half")
    assert sorted(resume.complete_shards(out, shards, verify=True, fmt=PACKED)) == [0, 1]

    (tmp_path / "emb" / PACKED.file_name(1)).write_bytes(b"damaged")
    assert sorted(resume.complete_shards(out, shards, verify=True, fmt=PACKED)) == [0]
    assert sorted(resume.complete_shards(out, shards, verify=False, fmt=PACKED)) == [
        0,
        1,
    ]  # the file's hash unread
    (tmp_path / "emb" / PACKED.file_name(0)).unlink()
    assert sorted(resume.complete_shards(out, shards, verify=False, fmt=PACKED)) == [1]
    (tmp_path / "emb" / "_progress" / "embeddings-000001.json").write_text("{cut")
    assert (
        resume.complete_shards(out, shards, verify=False, fmt=PACKED) == {}
    )  # an unreadable entry is redone


@pytest.mark.parametrize(
    "record",
    ["[]", "{}", '"text"', '{"index": 0}', '{"index": 1, "name": "x", "sha256": "y", "input_sha256": "in0"}'],
)
def test_a_progress_record_that_is_not_one_is_redone_not_trusted(tmp_path, record):
    """A shard's record is JSON anyone can edit: one that is not a record this stage wrote (a list,
    an empty object, another shard's) makes its shard be done again, not a traceback or a false
    "input changed"."""
    out, shards = str(tmp_path / "emb"), specs(2)
    commit(out, shards[0])
    commit(out, shards[1])
    (tmp_path / "emb" / "_progress" / "embeddings-000000.json").write_text(record)
    assert sorted(resume.complete_shards(out, shards, verify=True, fmt=PACKED)) == [1]


@pytest.mark.parametrize("record", ["[]", '"text"', "3"])
def test_a_claim_that_is_not_an_object_is_named_damaged(tmp_path, record):
    out = str(tmp_path / "emb")
    resume.claim_output(out, RUN)
    (tmp_path / "emb" / "_progress" / "run.json").write_text(record)
    with pytest.raises(
        EmbedError, match=r"run.json is not an elmo embed marker \(a JSON object naming the run"
    ):
        resume.claim_output(out, RUN)


def test_an_entry_lacking_a_count_is_redone_unless_the_output_is_of_the_first_schema(tmp_path):
    out, shards = str(tmp_path / "emb"), specs(2)
    entries = [commit(out, spec) for spec in shards]
    record = tmp_path / "emb" / "_progress" / "embeddings-000001.json"
    record.write_text(json.dumps({k: v for k, v in entries[1].items() if k != "split_sentences"}))
    assert resume.complete_shards(out, shards, verify=True, fmt=PACKED) == {0: entries[0]}
    record.write_text(json.dumps({**entries[1], "tokens": -3}))  # a count is a whole number >= 0
    assert list(resume.complete_shards(out, shards, verify=True, fmt=PACKED)) == [0]
    # a first-schema output's entries were written before some counts existed: those count 0
    first = {"format": manifest.FIRST_SCHEMA, **{k: v for k, v in RUN.items() if k != "schema"}}
    (tmp_path / "emb" / "_progress" / "run.json").write_text(json.dumps(first))
    record.write_text(json.dumps({k: v for k, v in entries[1].items() if k != "split_sentences"}))
    found = resume.complete_shards(out, shards, verify=True, fmt=PACKED)
    assert found == {0: entries[0], 1: {**entries[1], "split_sentences": 0}}


def test_a_changed_input_is_refused_not_mixed(tmp_path):
    out, shards = str(tmp_path / "emb"), specs(3)
    commit(out, shards[2])
    with pytest.raises(EmbedError, match="has shard 2 but the input now makes only 2 shards"):
        resume.complete_shards(out, shards[:2], verify=False, fmt=PACKED)
    changed = [*shards[:2], ShardSpec(2, 20, 10, segments=(), input_sha256="other")]
    with pytest.raises(EmbedError, match="input lines 20-29 changed since the previous run"):
        resume.complete_shards(out, changed, verify=False, fmt=PACKED)


def test_a_commit_never_creates_the_output_folder_moved_away_mid_run(tmp_path):
    """Issue 65, item 4: the other writer re-created a moved-away output with shards and progress
    records but no ``run.json``, which the rerun refused; now the commit names the folder gone."""
    out = str(tmp_path / "emb")
    resume.claim_output(out, RUN)
    commit(out, specs(2)[0])
    os.rename(out, tmp_path / "moved")
    shard = shard_of(10, [np.zeros((2, 4), np.float32)] * 10)
    with pytest.raises(EmbedError) as caught:
        resume.commit_shard(out, {"index": 1, "input_sha256": "in1", **COUNTS}, shard, PACKED)
    assert str(caught.value) == (
        f"output {out}: the folder is gone (moved or deleted while the run wrote it), and a commit never "
        "creates it: move it back and rerun, or rerun into a new output"
    )
    assert not os.path.exists(out)
    os.rename(tmp_path / "moved", out)  # moved back: the rerun resumes it
    assert list(resume.complete_shards(out, specs(2), verify=True, fmt=PACKED)) == [0]


def test_a_failed_run_takes_back_its_claim_and_its_folders_unless_it_committed(tmp_path):
    out = str(tmp_path / "new" / "emb")
    with pytest.raises(RuntimeError), taken_back_on_failure(out, resume.OWN_FILES, claimed=False) as guard:
        resume.claim_output(out, RUN)
        guard.claimed = True
        raise RuntimeError("the model did not load")
    assert not (tmp_path / "new").exists()

    with pytest.raises(RuntimeError), taken_back_on_failure(out, resume.OWN_FILES, claimed=False) as guard:
        resume.claim_output(out, RUN)
        guard.claimed = True
        commit(out, specs(1)[0])
        raise RuntimeError("killed after a shard")
    assert (tmp_path / "new" / "emb" / "_progress" / "run.json").is_file()  # a rerun resumes it


def test_only_this_stages_files_make_an_output_its_own(tmp_path):
    out = tmp_path / "emb"
    resume.check_own_folder(str(out))  # new
    out.mkdir()
    resume.check_own_folder(str(out))  # empty
    commit(str(out), specs(1)[0], claim=False)
    with pytest.raises(EmbedError, match="but no _progress/run.json: not an elmo embed output"):
        resume.check_own_folder(str(out))
    resume.claim_output(str(out), RUN)
    resume.check_own_folder(str(out))
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EmbedError, match="holds notes.txt, which elmo embed did not write"):
        resume.check_own_folder(str(out))


def test_a_single_file_output_is_never_a_folder_nor_replaced_without_overwrite(tmp_path):
    with pytest.raises(EmbedError, match="is a folder, not a file"):
        resume.check_single_file(str(tmp_path), overwrite=False)
    target = tmp_path / "vectors.hdf5"
    resume.check_single_file(str(target), overwrite=False)
    target.write_bytes(b"earlier")
    with pytest.raises(EmbedError, match="already exists; pass --overwrite"):
        resume.check_single_file(str(target), overwrite=False)
    resume.check_single_file(str(target), overwrite=True)

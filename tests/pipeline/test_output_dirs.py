"""Taking back the local folders a failed run created (pipeline/output_dirs.py)."""

from __future__ import annotations

import os

import pytest

from pipeline.output_dirs import missing_dirs, remove_empty_dirs, removed_on_failure


def test_the_missing_folders_are_named_deepest_first_and_none_on_s3(tmp_path):
    out = tmp_path / "a" / "b" / "c"
    assert missing_dirs(str(out)) == [str(out), str(tmp_path / "a" / "b"), str(tmp_path / "a")]
    assert missing_dirs(str(tmp_path)) == []
    assert missing_dirs("s3://bucket/a/b") == []


def test_a_failed_run_leaves_no_folder_of_its_own_and_touches_nothing_else(tmp_path):
    out = tmp_path / "new" / "deep" / "out"
    with pytest.raises(RuntimeError), removed_on_failure(str(out)):
        os.makedirs(out)
        raise RuntimeError("empty corpus")
    assert sorted(os.listdir(tmp_path)) == []

    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), removed_on_failure(str(tmp_path / "kept" / "out")):
        os.makedirs(tmp_path / "kept" / "out")
        raise RuntimeError("refused setting")
    assert os.listdir(tmp_path) == ["kept"]  # it existed before the run


def test_a_folder_the_run_wrote_into_stays_with_its_parents(tmp_path):
    out = tmp_path / "new" / "out"
    with pytest.raises(RuntimeError), removed_on_failure(str(out)):
        os.makedirs(out)
        (out / "shard-000000.tar").write_bytes(b"resumable")
        raise RuntimeError("killed later")
    assert (out / "shard-000000.tar").read_bytes() == b"resumable"
    remove_empty_dirs([str(tmp_path / "gone"), str(out)])  # a missing one is skipped, a full one stops it
    assert out.is_dir()


def test_a_run_that_succeeds_keeps_its_folders(tmp_path):
    out = tmp_path / "new" / "out"
    with removed_on_failure(str(out)):
        os.makedirs(out)
    assert out.is_dir()

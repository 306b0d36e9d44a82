"""pipeline/output_owner.py: one rule for every stage's output folder (the stages' own tests cover
each marker's content): what is refused before a run writes anything."""

from __future__ import annotations

import json
import re

import pytest

from pipeline import storage
from pipeline.errors import PipelineError
from pipeline.output_owner import OwnFiles, check_owned, read_marker

OWN = OwnFiles("demo", "demo_run.json", re.compile(r"demo_run\.json|data/.+"))


def test_a_new_empty_or_own_folder_is_fine_and_anything_else_one_line(tmp_path):
    assert check_owned(str(tmp_path / "new"), OWN, PipelineError) is False
    (tmp_path / "own" / "data").mkdir(parents=True)
    (tmp_path / "own" / "demo_run.json").write_text('{"stage": "demo"}')
    (tmp_path / "own" / "data" / "x").write_text("1")
    assert check_owned(str(tmp_path / "own"), OWN, PipelineError) is True
    (tmp_path / "file").write_text("x")
    with pytest.raises(PipelineError, match=r"output .*file is a file, not a folder; choose an empty"):
        check_owned(str(tmp_path / "file"), OWN, PipelineError)


def test_a_link_to_a_folder_outside_is_refused_and_nothing_written_through_it(tmp_path):
    """``os.walk`` does not descend into a linked folder, so its files were invisible to the check
    and a run wrote through the link into the user's folder."""
    users = tmp_path / "users"
    users.mkdir()
    (users / "thesis.txt").write_text("mine")
    own = tmp_path / "own"
    (own / "data").mkdir(parents=True)
    (own / "demo_run.json").write_text('{"stage": "demo"}')
    (own / "data" / "more").symlink_to(users, target_is_directory=True)
    with pytest.raises(PipelineError, match=r"holds data/more, a link to a folder outside it"):
        check_owned(str(own), OWN, PipelineError)
    (own / "data" / "more").unlink()
    (own / "data" / "inner").mkdir()
    (own / "data" / "latest").symlink_to("inner", target_is_directory=True)  # inside: a tool's own link
    assert check_owned(str(own), OWN, PipelineError) is True


def test_appends_never_go_through_a_link(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text("mine\n")
    (tmp_path / "metrics.jsonl").symlink_to(users)
    with pytest.raises(storage.StorageError, match="a link, not a file this run wrote"):
        storage.append_local(str(tmp_path / "metrics.jsonl"), b"row\n")
    assert users.read_text() == "mine\n"


@pytest.mark.parametrize("text", ["{}", '{"stage": "demo", "run": "r"}'])
def test_a_marker_is_a_json_object_of_its_stage(tmp_path, text):
    (tmp_path / "demo_run.json").write_text(text)
    assert read_marker(str(tmp_path), OWN, PipelineError) == json.loads(text)


@pytest.mark.parametrize("text", ["[]", "text", '"s"', '{"stage": "other"}'])
def test_a_marker_that_is_not_its_stages_is_one_line(tmp_path, text):
    (tmp_path / "demo_run.json").write_text(text)
    with pytest.raises(PipelineError) as err:
        read_marker(str(tmp_path), OWN, PipelineError)
    assert "is not an elmo demo marker" in str(err.value) and "\n" not in str(err.value)

"""Single-file mode's merge (pipeline/embed/single_file.py): the shards in line order into one file
as AllenNLP's ``elmo`` wrote it, checked line by line, then the parts taken away."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from embed_fixtures import write_shard_file

from pipeline.embed.errors import EmbedError
from pipeline.embed.inputs import plan_shards
from pipeline.embed.single_file import PARTS_FORMAT, delete_parts, merge, parts_path

TEXT = "In the beginning\n\n  God created \nthe heaven\nIn the beginning\n"
RULES = {"max_tokens": 100, "long_sentences": "split", "invalid_utf8": "replace"}


def write_parts(tmp_path, lines_per_shard=2, skip_line=None):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    specs = plan_shards("text", [str(corpus)], lines_per_shard)
    parts = parts_path(str(tmp_path / "vectors.hdf5"))
    for spec in specs:
        lines = [n for n in range(spec.first_line, spec.first_line + spec.num_lines) if n != skip_line]
        values = [np.full((2, 4), n, dtype=np.float32) for n in lines]
        # a part holds consecutive lines from its first; skip_line leaves the last one out
        path = tmp_path / "vectors.hdf5.parts" / PARTS_FORMAT.file_name(spec.index)
        path.parent.mkdir(exist_ok=True)
        write_shard_file(path, spec.first_line, values)
    return specs, parts


def test_the_merged_file_is_allennlps_layout_with_its_sentence_index(tmp_path):
    specs, parts = write_parts(tmp_path)
    assert [(s.first_line, s.num_lines) for s in specs] == [(0, 2), (2, 2), (4, 1)]
    output = str(tmp_path / "vectors.hdf5")
    merge(parts, specs, output, **RULES)
    with h5py.File(output, "r") as f:
        assert sorted(k for k in f.keys() if k != "sentence_to_index") == ["0", "1", "2", "3", "4"]
        assert f["3"][()].tolist() == [[3.0] * 4] * 2
        index = json.loads(f["sentence_to_index"][0])
    # stripped texts; a repeated sentence keeps its last line, as AllenNLP's did
    assert index == {"In the beginning": "4", "": "1", "God created": "2", "the heaven": "3"}
    delete_parts(parts)
    assert not (tmp_path / "vectors.hdf5.parts").exists()


def test_a_part_that_lacks_a_line_is_refused_and_nothing_is_written(tmp_path):
    specs, parts = write_parts(tmp_path, skip_line=3)
    output = tmp_path / "vectors.hdf5"
    with pytest.raises(EmbedError, match=r"embeddings-000001.hdf5: holds lines up to 2, expected 3"):
        merge(parts, specs, str(output), **RULES)
    assert not output.exists()

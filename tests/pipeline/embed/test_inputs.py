"""pipeline.embed.inputs: fixed line ranges over text files and shard directories, read back exactly."""

from __future__ import annotations

import gzip
import hashlib
import io
import json

import pytest

from pipeline.embed import inputs
from pipeline.embed.errors import EmbedError
from pipeline.formats import shard_format
from pipeline.formats.shard_manifest import manifest_path
from pipeline.runtime import storage


def _all_lines(specs):
    return [line for spec in specs for line in inputs.read_lines(spec)]


@pytest.mark.parametrize("chunk", [3, 7, 4 * 1024 * 1024])
def test_text_ranges_cover_every_line_once(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(inputs, "READ_CHUNK", chunk)  # boundaries inside and across read chunks
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_bytes(b"one\ntwo two\n\nfour\nfive")  # no final newline: still a line
    b.write_bytes(b"six\n\xffseven\n")
    kind, paths = inputs.resolve_inputs([str(tmp_path / "*.txt")])
    assert kind == "text" and paths == [str(a), str(b)]
    specs = inputs.plan_shards(kind, paths, lines_per_shard=2)
    assert [(s.index, s.first_line, s.num_lines) for s in specs] == [
        (0, 0, 2),
        (1, 2, 2),
        (2, 4, 2),
        (3, 6, 1),
    ]
    assert [seg.path for seg in specs[2].segments] == [str(a), str(b)]  # a shard spanning two files
    assert _all_lines(specs) == [b"one", b"two two", b"", b"four", b"five", b"six", b"\xffseven"]


def test_input_hash_changes_with_content(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a\nb\nc\n")
    before = inputs.plan_shards("text", [str(path)], 2)
    path.write_bytes(b"a\nB\nc\n")
    after = inputs.plan_shards("text", [str(path)], 2)
    assert before[0].input_sha256 != after[0].input_sha256
    assert before[1].input_sha256 == after[1].input_sha256


def test_spec_roundtrip_through_json(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"x y\n" * 5)
    spec = inputs.plan_shards("text", [str(path)], 3)[1]
    assert inputs.ShardSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_empty_file_makes_no_shards(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    assert inputs.plan_shards("text", [str(path)], 3) == []


def test_missing_and_compressed_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(EmbedError, match=r"input: .*nope.txt: no such file"):
        inputs.resolve_inputs([str(tmp_path / "nope.txt")])
    (tmp_path / "c.txt.gz").write_bytes(b"x")
    with pytest.raises(EmbedError, match=r"c.txt.gz: compressed files are not read"):
        inputs.resolve_inputs([str(tmp_path / "c.txt.gz")])
    with pytest.raises(EmbedError, match="no input given"):
        inputs.resolve_inputs([])


def test_changed_input_detected_on_read(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a\nb\nc\nd\n")
    specs = inputs.plan_shards("text", [str(path)], 2)
    path.write_bytes(b"a\nb\n")
    with pytest.raises(EmbedError, match="the input changed"):
        inputs.read_lines(specs[1])


def test_a_line_edited_since_the_plan_is_refused_not_embedded_under_its_old_key(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a b\nc d\ne f\n")
    specs = inputs.plan_shards("text", [str(path)], 2)
    path.write_bytes(b"a b\nX d\ne f\n")  # same lines, same bytes, other words
    with pytest.raises(EmbedError, match=r"lines 0-1 changed since this run read them") as err:
        inputs.read_lines(specs[0])
    assert "keeps the shards done if their lines are unchanged (if any changed, it refuses" in str(err.value)
    assert inputs.read_lines(specs[1]) == [b"e f"]


@pytest.mark.parametrize("data", [gzip.compress(b"a b\n"), b"\xfd7zXZ\x00rest"], ids=["gzip", "xz"])
def test_compressed_data_under_a_text_name_is_refused_by_its_bytes(tmp_path, data):
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    with pytest.raises(
        EmbedError, match=r"corpus.txt: (gzip|xz)-compressed data \(shards are read by byte range\)"
    ):
        inputs.plan_shards("text", [str(path)], 10)


def write_shard_dir(root: str, tars: list[list[list[list[str]]]]) -> None:
    """A minimal shard directory: ``tars`` = train shards -> blocks -> sentences; ids are all <UNK>."""
    entries = []
    for s, blocks in enumerate(tars):
        buffer = io.BytesIO()
        with shard_format.tar_writer(buffer) as writer:
            for b, block in enumerate(blocks):
                ids = [2] * sum(map(len, block))
                writer.write(shard_format.encode_block(block, ids, shard_format.block_key("train", s, b)))
        data = buffer.getvalue()
        name = shard_format.shard_name("train", s)
        storage.write_bytes(storage.join(root, name), data)
        sentences = [sentence for block in blocks for sentence in block]
        entries.append(
            {
                "name": name,
                "sentences": len(sentences),
                "tokens": sum(map(len, sentences)),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    vocab = shard_format.encode_vocab(list(shard_format.SPECIALS))
    storage.write_bytes(storage.join(root, shard_format.VOCAB_FILE), vocab)
    manifest = {
        "shards": {"train": entries, "heldout": []},
        "totals": {
            "train": {
                "sentences": sum(e["sentences"] for e in entries),
                "tokens": sum(e["tokens"] for e in entries),
                "unk_tokens": sum(e["tokens"] for e in entries),  # the vocabulary holds the specials only
            },
            "heldout": {"sentences": 0, "tokens": 0, "unk_tokens": 0},
        },
        "vocab": {
            "file": shard_format.VOCAB_FILE,
            "counts_file": shard_format.COUNTS_FILE,
            "size": 3,
            "sha256": hashlib.sha256(vocab).hexdigest(),
        },
    }
    storage.write_bytes(manifest_path(root), json.dumps(manifest).encode())


def test_shard_directory_sentences_in_manifest_order(tmp_path):
    root = str(tmp_path / "shards")
    tars = [
        [[["a", "b"], ["c"]], [["d", "e", "f"]]],
        [[["g"], ["h", "i"]]],
    ]
    write_shard_dir(root, tars)
    kind, paths = inputs.resolve_inputs([root])
    assert (kind, paths) == ("shards", [root])
    specs = inputs.plan_shards(kind, paths, lines_per_shard=2, shard_splits=["train", "heldout"])
    assert [(s.first_line, s.num_lines) for s in specs] == [(0, 2), (2, 2), (4, 1)]
    assert _all_lines(specs) == [b"a b", b"c", b"d e f", b"g", b"h i"]
    with pytest.raises(EmbedError, match="unknown split 'dev'"):
        inputs.plan_shards(kind, paths, 2, shard_splits=["dev"])


def test_a_damaged_shard_is_named_not_embedded(tmp_path):
    root = str(tmp_path / "shards")
    write_shard_dir(root, [[[["a", "b"], ["c"]]] * 30, [[["g"], ["h", "i"]]]])
    specs = inputs.plan_shards("shards", [root], lines_per_shard=4, shard_splits=["train"])
    tar = storage.join(root, shard_format.shard_name("train", 0))
    data = storage.read_bytes(tar)
    storage.write_bytes(tar, data[: len(data) // 2 // 512 * 512])
    with pytest.raises(EmbedError, match=f"input: shard {tar} is truncated"):
        inputs.read_lines(specs[0])  # its first 4 sentences are still there: the hash tells
    assert inputs.read_lines(specs[-1]) == [b"g", b"h i"]


def _rewrite_manifest(root: str, change) -> None:
    path = manifest_path(root)
    manifest = json.loads(storage.read_bytes(path))
    change(manifest)
    storage.write_bytes(path, json.dumps(manifest).encode())


def test_a_manifest_is_not_trusted_for_names_checks_or_counts(tmp_path):
    root = str(tmp_path / "shards")
    write_shard_dir(root, [[[["a", "b"], ["c"]], [["d"]]] * 2])  # one tar of 6 sentences
    specs = inputs.plan_shards("shards", [root], lines_per_shard=4, shard_splits=["train"])
    assert _all_lines(specs) == [b"a b", b"c", b"d", b"a b", b"c", b"d"]
    # fewer sentences than the tar holds: the rest would silently go unembedded
    _rewrite_manifest(root, lambda m: m["shards"]["train"][0].update(sentences=5, tokens=6))
    specs = inputs.plan_shards("shards", [root], lines_per_shard=4, shard_splits=["train"])
    assert inputs.read_lines(specs[0]) == [b"a b", b"c", b"d", b"a b"]
    with pytest.raises(EmbedError, match=r"holds 6 sentences, its manifest says 5"):
        inputs.read_lines(specs[1])
    # ten trillion sentences in a tar of a few kB: refused before one spec is planned
    _rewrite_manifest(root, lambda m: m["shards"]["train"][0].update(sentences=10**13, tokens=10**13))
    with pytest.raises(EmbedError, match=r"claims 10,000,000,000,000 sentences, more than its"):
        inputs.plan_shards("shards", [root], lines_per_shard=1000, shard_splits=["train"])
    outside = tmp_path / "train-000000.tar"
    outside.write_bytes(storage.read_bytes(storage.join(root, "train-000000.tar")))
    _rewrite_manifest(root, lambda m: m["shards"]["train"][0].update(name="../train-000000.tar", sentences=6))
    with pytest.raises(EmbedError, match=r"'../train-000000.tar' is not a train-NNNNNN.tar file"):
        inputs.plan_shards("shards", [root], lines_per_shard=4, shard_splits=["train"])
    _rewrite_manifest(root, lambda m: m["shards"]["train"][0].update(name="train-000000.tar", sha256=""))
    with pytest.raises(EmbedError, match=r"sha256 is not a sha256"):
        inputs.plan_shards("shards", [root], lines_per_shard=4, shard_splits=["train"])


def test_record_corpora_are_known_by_their_content_not_their_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["One. Two."]}), tmp_path / "docs.data")
    (tmp_path / "docs.txt").write_text('{"id": 1, "text": "One. Two."}\n')
    (tmp_path / "plain.txt").write_text("a sentence a line\n")
    for name in ("docs.data", "docs.txt"):
        assert inputs.resolve_inputs([str(tmp_path / name)]) == ("records", [str(tmp_path / name)])
    assert inputs.resolve_inputs([str(tmp_path / "plain.txt")]) == ("text", [str(tmp_path / "plain.txt")])

"""What a shard directory records about itself (pipeline/shard/manifest.py): the run's identity,
the plan a rerun may reuse, and the manifest's line accounting and totals."""

from __future__ import annotations

import json

from pipeline.shard.manifest import (
    FORMAT_VERSION,
    build_manifest,
    build_plan,
    encode_json,
    plan_chunks,
    run_identity,
)
from pipeline.shard.passes import ChunkSummary
from pipeline.shard.sentences import LineStats
from pipeline.shard.vocabulary import build_vocabulary
from pipeline.shard.writer import ShardRecord

CONFIG = {
    "tokenizer": "moses",
    "seed": 3,
    "output": "/a",
    "workers": 4,
    "progress": True,
    "chunk_bytes": 1024,
}
VOCAB = build_vocabulary({"the": 5, "cat": 2}, num_sentences=3)


def chunk(index: int, source: int, **stats) -> ChunkSummary:
    return ChunkSummary(index, source, LineStats(**stats), {"train": 0, "heldout": 0})


CHUNKS = [
    chunk(0, 0, lines=10, empty=1, overlong=1, train_sentences=7, train_tokens=40, heldout_sentences=1,
          heldout_tokens=6, max_sentence_tokens=9),
    chunk(1, 0, lines=5, invalid_utf8=2, train_sentences=5, train_tokens=20, max_sentence_tokens=4),
    chunk(2, 1, lines=4, control_chars=1, heldout_sentences=4, heldout_tokens=12, max_sentence_tokens=5),
]  # fmt: skip


VERSIONS = {"a.txt": {"bytes": 10, "modified_ns": 5}, "h.txt": {"bytes": 3, "etag": '"e"'}}


def test_the_identity_leaves_out_how_the_run_was_run():
    identity = run_identity(CONFIG, ["a.txt"], ["h.txt"], VERSIONS)
    assert identity == {
        "config": {"tokenizer": "moses", "seed": 3},
        "inputs": ["a.txt"],
        "heldout_inputs": ["h.txt"],
        "input_versions": VERSIONS,
    }
    other_runtime = run_identity(
        {**CONFIG, "workers": 1, "output": "s3://b/x"}, ["a.txt"], ["h.txt"], VERSIONS
    )
    assert other_runtime == identity


def test_a_plan_is_reused_only_by_the_same_run_with_the_same_chunking():
    identity = run_identity(CONFIG, ["a.txt"], [], VERSIONS)
    plan = json.loads(encode_json(build_plan(identity, 1024, CHUNKS, VOCAB)))  # as read back from disk
    assert plan["vocab_sha256"] == VOCAB.sha256
    assert plan_chunks(plan, identity, 1024) == CHUNKS
    assert plan_chunks(plan, identity, 2048) is None
    assert plan_chunks(plan, run_identity({**CONFIG, "seed": 4}, ["a.txt"], [], VERSIONS), 1024) is None
    assert plan_chunks({**plan, "format_version": FORMAT_VERSION + 1}, identity, 1024) is None


def test_the_manifest_accounts_for_every_line_and_sums_the_shards():
    identity = run_identity(CONFIG, ["a.txt"], ["h.txt"], VERSIONS)
    shards = {
        "train": [ShardRecord("train-000000.tar", 12, 60, 2, 1000, "s0", 3)],
        "heldout": [
            ShardRecord("heldout-000000.tar", 3, 10, 1, 300, "h0", 0, unigram_nll=21.5),
            ShardRecord("heldout-000001.tar", 2, 8, 1, 200, "h1", 1, unigram_nll=17.0),
        ],
    }
    kneser_ney = [{"order": 3, "perplexity": 41.5, "nll": 67.0, "targets": 18}]
    manifest = build_manifest(
        identity, ["a.txt", "h.txt"], 1, CHUNKS, VOCAB, 2, shards, {"kneser_ney": kneser_ney}
    )
    lines = manifest["lines"]
    assert (
        lines["read"]
        == 19
        == lines["sentences"]["train"] + lines["sentences"]["heldout"] + sum(lines["skipped"].values())
    )
    assert (lines["invalid_utf8_replaced"], lines["control_chars_replaced"]) == (2, 1)
    assert lines["longest_sentence_tokens"] == 9
    assert [(r["path"], r["role"], r["lines"]) for r in manifest["inputs_detail"]] == [
        ("a.txt", "train+heldout", 15),
        ("h.txt", "heldout", 4),
    ]
    assert manifest["totals"]["heldout"] == {
        "sentences": 5, "tokens": 18, "shards": 2, "blocks": 2, "unk_tokens": 1, "unk_rate": 1 / 18,
        "bytes": 500,
    }  # fmt: skip
    assert manifest["shards"]["heldout"][1]["unigram_nll"] == 17.0
    assert "unigram_nll" not in manifest["shards"]["train"][0]  # held-out shards only
    assert manifest["baselines"] == {"kneser_ney": kneser_ney}
    assert manifest["vocab"]["size"] == VOCAB.size and manifest["config"] == {"tokenizer": "moses", "seed": 3}
    # sorted keys, fixed indentation: equal content, equal bytes
    assert encode_json(manifest) == encode_json(json.loads(encode_json(manifest)))

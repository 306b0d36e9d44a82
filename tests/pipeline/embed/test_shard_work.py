"""pipeline.embed.shard_work: a shard prepared on the CPU (read, tokenized, planned, character ids)."""

from __future__ import annotations

import pytest
from embed_fixtures import line_tokens, sample_lines

from elmo_model.characters import token_to_ids
from elmo_model.static_batches import BOUNDARIES, BucketPlan
from pipeline.embed.inputs import plan_shards
from pipeline.embed.shard_work import ShardWork, WorkSettings, prepare_shard


def _settings(stateful=False, fixed=False, **kw) -> WorkSettings:
    base = dict(max_sentence_tokens=100, long_sentences="split", invalid_utf8="replace")
    return WorkSettings(stateful=stateful, plan=BucketPlan(256, 8, fixed=fixed), **{**base, **kw})


@pytest.fixture()
def spec(tmp_path):
    lines = sample_lines(20, start=300)
    lines[3] = b""
    lines[9] = b" ".join([b"w%d" % i for i in range(250)])  # pieces of 100, 100, 50
    lines[12] = b"bad \xff byte"
    path = tmp_path / "in.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    (only,) = plan_shards("text", [str(path)], 100)
    return only, lines


@pytest.mark.parametrize("fixed", [False, True], ids=["cpu passes", "cuda buckets"])
def test_passes_carry_every_piece_once_with_its_character_ids(spec, fixed):
    spec, lines = spec
    work = ShardWork.from_bytes(prepare_shard(spec, True, _settings(fixed=fixed)).to_bytes())
    assert not work.error and work.num_lines == len(lines)
    tokens = [line_tokens(line) for line in lines]
    pieces = [t[i : i + 100] for t in tokens for i in range(0, len(t), 100)]
    assert work.sizes == [len(p) for p in pieces]
    assert work.owner.count(9) == 3 and 3 not in work.owner
    assert work.stats["tokens"] == sum(map(len, tokens)) and work.stats["split_sentences"] == 1
    assert work.stats["empty_sentences"] == 1 and work.stats["invalid_utf8_lines"] == 1
    seen = []
    for indices, batch in work.passes:
        rows, steps = batch.positions.shape
        assert rows * steps <= 256 or rows == 1
        for r, i in enumerate(indices):
            n = len(pieces[i])
            assert batch.lengths[r] == n + BOUNDARIES
            spelled = [tuple(batch.chars[k]) for k in batch.positions[r, 1 : n + 1]]
            assert spelled == [tuple(token_to_ids(t)) for t in pieces[i]]
        seen.extend(indices)
    assert sorted(seen) == list(range(len(pieces)))
    assert not work.pieces


def test_stateful_keeps_the_token_lists_in_order_and_refuses_a_split(spec):
    spec, lines = spec
    work = prepare_shard(spec, False, _settings(stateful=True, max_sentence_tokens=1000))
    assert not work.passes and work.pieces == [line_tokens(line) for line in lines if line_tokens(line)]
    assert not work.write
    refused = prepare_shard(spec, True, _settings(stateful=True))
    assert (
        "line 9 has more than max_sentence_tokens=100 tokens: stateful mode cannot split it" in refused.error
    )


def test_an_input_problem_becomes_the_shards_error(spec):
    spec, _ = spec
    work = prepare_shard(spec, True, _settings(invalid_utf8="error"))
    assert "line 12 is not valid UTF-8" in work.error and not work.passes

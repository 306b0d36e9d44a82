"""Row-stream batching (docs/training.md#batching, docs/training.md#held-out-perplexity) on bilm-tf's training fixture, shard-level behaviour,
resumable positions, rank splits and the per-epoch step count."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from train_shards import fixture_sentences, fixture_vocab, many_shards_dir, word_ids, write_shard_dir

from elmo_model.characters import token_to_ids
from pipeline.formats import shard_format
from pipeline.formats.shard_format import BOS_ID, EOS_ID, UNK_ID
from pipeline.formats.shard_manifest import read_manifest
from pipeline.runtime import storage
from pipeline.train.char_cache import CharCache
from pipeline.train.data import LMBatchStream, load_char_cache, open_lm_batches
from pipeline.train.run_length import steps_per_epoch
from pipeline.train.sentence_source import ReadAhead

BOS, EOS, UNK = shard_format.BOS, shard_format.EOS, shard_format.UNK


def rule_batches(sentences, batch_size, unroll, reverse):
    """The batching rule of docs/training.md#batching transcribed on plain word lists: [(inputs, targets)], each
    B lists of U words; the partial batch at the end is dropped."""
    wrapped = iter([[EOS, *s[::-1], BOS] if reverse else [BOS, *s, EOS] for s in sentences])
    buffers: list[list[str]] = [[] for _ in range(batch_size)]
    batches = []
    while True:
        inputs: list[list[str]] = [[] for _ in range(batch_size)]
        targets: list[list[str]] = [[] for _ in range(batch_size)]
        for i in range(batch_size):
            while len(inputs[i]) < unroll:
                if len(buffers[i]) <= 1:
                    nxt = next(wrapped, None)
                    if nxt is None:
                        return batches
                    buffers[i] = nxt
                k = min(len(buffers[i]) - 1, unroll - len(inputs[i]))
                inputs[i] += buffers[i][:k]
                targets[i] += buffers[i][1 : k + 1]
                buffers[i] = buffers[i][k:]
        batches.append((inputs, targets))


@pytest.fixture(scope="module")
def vocab():
    return fixture_vocab()


@pytest.fixture(scope="module")
def cache(vocab):
    return CharCache(vocab)


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory, vocab):
    """The 5 fixture sentences as one train shard of two blocks, and as the held-out split."""
    root = str(tmp_path_factory.mktemp("fixture_shards"))
    s = fixture_sentences()
    write_shard_dir(root, {"train": [[s[:3], s[3:]]], "heldout": [[s[:2], s[2:]]]}, vocab)
    return root


def test_fixture_test_mode_matches_the_rule_row_by_row(fixture_dir, cache, vocab):
    stream = open_lm_batches(fixture_dir, "train", cache, batch_size=2, unroll_steps=5, test=True)
    batches = list(stream)
    sentences = fixture_sentences()
    expected = [rule_batches(sentences, 2, 5, reverse=r) for r in (False, True)]
    # 134 words + 5 sentences = 139 predictions per direction, 10 per batch; the batch in which
    # the data runs out is dropped, with what is left in the other row's buffer (docs/training.md#held-out-perplexity)
    assert len(batches) == len(expected[0]) == len(expected[1]) == 11
    for n, batch in enumerate(batches):
        assert batch.char_ids.shape == (2, 2, 5, 50) and batch.char_ids.dtype == torch.int64
        assert batch.token_ids.shape == batch.targets.shape == (2, 2, 5)
        assert batch.n_tokens == 10
        assert int(batch.char_ids.min()) > 0
        for d in (0, 1):
            inputs, targets = expected[d][n]
            for i in range(2):
                assert batch.token_ids[d, i].tolist() == word_ids(inputs[i], vocab)
                assert batch.targets[d, i].tolist() == word_ids(targets[i], vocab)
                # characters always spell the real word, in vocabulary or not
                spelled = np.stack([token_to_ids(w) for w in inputs[i]])
                np.testing.assert_array_equal(batch.char_ids[d, i].numpy(), spelled)


def test_fixture_first_batches_by_hand(fixture_dir, cache, vocab):
    """The first two batches of bilm-tf's fixture, derived by hand from the rule."""
    b0, b1 = (next(it) for it in [open_lm_batches(fixture_dir, "train", cache, 2, 5, test=True)] * 2)
    ids = lambda s: word_ids(s.split(), vocab)  # noqa: E731
    assert b0.token_ids[0].tolist() == [
        ids("<S> neural language models use"),
        ids("<S> these models make use"),
    ]
    assert b0.targets[0].tolist() == [
        ids("neural language models use continuous"),
        ids("these models make use of"),
    ]
    assert b1.token_ids[0].tolist() == [
        ids("continuous representations or embeddings of"),
        ids("of neural networks . <S>"),
    ]
    assert b1.targets[0].tolist() == [
        ids("representations or embeddings of words"),
        ids("neural networks . </S> continuous"),
    ]
    assert b0.token_ids[1].tolist() == [
        ids("</S> . predictions their make"),
        ids("</S> . networks neural of"),
    ]
    assert b0.targets[1].tolist() == [ids(". predictions their make to"), ids(". networks neural of use")]
    # row 1 finishes sentence 2 and starts sentence 3 (row 0 is still in sentence 1)
    assert b1.token_ids[1].tolist()[1] == ids("use make models these </S>")
    assert b1.targets[1].tolist()[1] == ids("make models these <S> .")
    # "representations" is out of vocabulary: <UNK> target, real spelling as input
    assert b1.targets[0, 0, 0].item() == UNK_ID
    np.testing.assert_array_equal(b1.char_ids[0, 0, 1].numpy(), token_to_ids("representations"))


@pytest.mark.parametrize("unroll", [1, 3, 7])
def test_test_mode_rows_are_continuous_sentence_streams(fixture_dir, cache, unroll):
    """Held-out rows carry across batches: joined over batches, each row reads whole sentences
    <S> w1..wn and predicts w1..wn </S>, whatever the unroll length."""
    batches = list(open_lm_batches(fixture_dir, "heldout", cache, 2, unroll, test=True))
    assert batches
    for d, (first, last) in enumerate([(BOS_ID, EOS_ID), (EOS_ID, BOS_ID)]):
        for i in range(2):
            inputs = np.concatenate([b.token_ids[d, i].numpy() for b in batches])
            targets = np.concatenate([b.targets[d, i].numpy() for b in batches])
            assert inputs[0] == first and last not in inputs
            np.testing.assert_array_equal(targets[:-1][inputs[1:] != first], inputs[1:][inputs[1:] != first])
            np.testing.assert_array_equal(targets[:-1][inputs[1:] == first], last)


def test_training_never_inputs_the_closing_boundary(fixture_dir, cache):
    stream = open_lm_batches(fixture_dir, "train", cache, 3, 4, seed=5)
    for _ in range(60):  # many passes over 5 sentences: training cycles forever
        batch = next(stream)
        assert EOS_ID not in batch.token_ids[0] and BOS_ID not in batch.token_ids[1]
        assert BOS_ID not in batch.targets[0] and EOS_ID not in batch.targets[1]
        assert int(batch.char_ids.min()) > 0


def take(stream, n):
    return [next(stream) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for name in ("char_ids", "token_ids", "targets"):
            assert getattr(x, name).equal(getattr(y, name)), name


@pytest.mark.parametrize("rank,world_size,skip", [(0, 1, 4), (1, 2, 9), (0, 1, 0)])
def test_state_dict_round_trip_continues_identically(tmp_path, vocab, cache, rank, world_size, skip):
    many_shards_dir(str(tmp_path), vocab)

    def stream():
        return open_lm_batches(str(tmp_path), "train", cache, 3, 4, rank=rank, world_size=world_size, seed=3)

    reference = stream()
    take(reference, skip)
    state = json.loads(json.dumps(reference.state_dict()))  # checkpoints store it as JSON
    expected = take(reference, 25)  # crosses shard and pass boundaries
    resumed = stream()
    take(resumed, 2)  # a stream elsewhere is moved to the saved position
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, 25), expected)
    assert len(json.dumps(state)) < 4000


def test_state_dict_rejects_another_rank(tmp_path, vocab, cache):
    many_shards_dir(str(tmp_path), vocab)
    state = open_lm_batches(str(tmp_path), "train", cache, 3, 4, rank=0, world_size=2).state_dict()
    other = open_lm_batches(str(tmp_path), "train", cache, 3, 4, rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank is 0 in the checkpoint but 1 now"):
        other.load_state_dict(state)


def test_steps_per_epoch_from_manifest(fixture_dir):
    manifest = read_manifest(fixture_dir)
    assert manifest.totals["train"].tokens == 134
    assert steps_per_epoch(manifest, 2, 5, 1) == 13  # int(134 / 10)
    assert steps_per_epoch(manifest, 2, 5, 2) == 6  # int(134 / 20): same on every rank
    assert steps_per_epoch(manifest, 128, 20, 3) == 0
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        steps_per_epoch(manifest, 2, 5, 0)


def test_uneven_ranks_both_keep_yielding(tmp_path, vocab, cache):
    """3 shards over 2 ranks: rank 1 holds half the data of rank 0, and still never runs out."""
    many_shards_dir(str(tmp_path), vocab)
    manifest = read_manifest(str(tmp_path))
    steps = 5 * steps_per_epoch(manifest, 2, 3, 2)
    for rank in (0, 1):
        stream = open_lm_batches(str(tmp_path), "train", cache, 2, 3, rank=rank, world_size=2)
        assert len(take(stream, steps)) == steps


def test_manifest_that_does_not_match_the_shards(tmp_path, vocab, cache):
    many_shards_dir(str(tmp_path), vocab)
    manifest = read_manifest(str(tmp_path))
    entries = list(manifest.shards["train"])
    entries[1] = replace(entries[1], sentences=entries[1].sentences + 1)
    manifest = replace(manifest, shards={**manifest.shards, "train": tuple(entries)})
    stream = open_lm_batches(str(tmp_path), "train", cache, 2, 3, test=True, manifest=manifest)
    with pytest.raises(shard_format.FormatError, match=r"train-000001.tar: manifest lists 8 sentences"):
        list(stream)


def test_shard_ids_outside_the_vocabulary(tmp_path, vocab):
    many_shards_dir(str(tmp_path), vocab)
    small = CharCache(vocab[:5])
    manifest = read_manifest(str(tmp_path))
    manifest = replace(manifest, vocab=replace(manifest.vocab, size=5))
    stream = open_lm_batches(str(tmp_path), "train", small, 2, 3, manifest=manifest)
    with pytest.raises(shard_format.FormatError, match="outside the vocabulary of 5"):
        next(stream)


def test_rank_without_sentences_is_an_error(tmp_path, vocab, cache):
    write_shard_dir(str(tmp_path), {"train": [[[["of", "the"]]]]}, vocab)
    stream = open_lm_batches(str(tmp_path), "train", cache, 1, 2, rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank 1 of 2: its 1 shard"):
        next(stream)


def test_s3_shards_give_the_same_batches(s3_prefix, fixture_dir, vocab):
    s = fixture_sentences()
    write_shard_dir(s3_prefix, {"train": [[s[:3], s[3:]]], "heldout": [[s[:2], s[2:]]]}, vocab)
    remote_cache = load_char_cache(s3_prefix)
    np.testing.assert_array_equal(remote_cache.table, CharCache(vocab).table)
    local = take(open_lm_batches(fixture_dir, "train", remote_cache, 2, 5, seed=9), 20)
    remote = take(open_lm_batches(s3_prefix, "train", remote_cache, 2, 5, seed=9), 20)
    assert_same_batches(local, remote)
    assert storage.is_s3(s3_prefix)


def test_lm_batch_stream_checks_arguments(fixture_dir, cache):
    urls = read_manifest(fixture_dir).urls("train")
    with pytest.raises(ValueError, match="unroll_steps must be >= 1"):
        LMBatchStream(urls, cache, 2, 0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        LMBatchStream(urls, cache, 0, 2)
    with pytest.raises(ValueError, match="rank 2 is outside world size 2"):
        LMBatchStream(urls, cache, 2, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="no shards to read"):
        LMBatchStream([], cache, 2, 2)


# ---- reading the next shard ahead ----------------------------------------------------------------


@pytest.mark.parametrize(
    "rank,world_size,test,mode",
    [
        (0, 1, False, ReadAhead.process),
        (1, 2, False, ReadAhead.thread),
        (0, 1, True, ReadAhead.thread),
        (1, 3, True, ReadAhead.process),
    ],
)
def test_read_ahead_stream_equals_the_synchronous_one(tmp_path, vocab, cache, rank, world_size, test, mode):
    many_shards_dir(str(tmp_path), vocab, n_shards=4)

    def stream(prefetch):
        return open_lm_batches(
            str(tmp_path),
            "train",
            cache,
            2,
            3,
            rank=rank,
            world_size=world_size,
            seed=4,
            test=test,
            prefetch=prefetch,
        )

    n = 40  # several passes for a training stream, the whole pass for a test one
    expected = list(itertools.islice(stream(ReadAhead.off), n))
    ahead = stream(mode)
    assert_same_batches(list(itertools.islice(ahead, n)), expected)
    ahead.close()


def test_read_ahead_stream_resumes_exactly(tmp_path, vocab, cache):
    many_shards_dir(str(tmp_path), vocab)

    def stream(prefetch):
        return open_lm_batches(str(tmp_path), "train", cache, 3, 4, seed=3, prefetch=prefetch)

    reference = stream(ReadAhead.off)
    take(reference, 6)
    state = json.loads(json.dumps(reference.state_dict()))
    expected = take(reference, 25)
    resumed = stream(ReadAhead.process)
    take(resumed, 11)  # its read-ahead is for another shard than the saved position needs
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, 25), expected)
    assert resumed.state_dict() == reference.state_dict()
    resumed.close()

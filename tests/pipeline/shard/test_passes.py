import dataclasses
from collections import Counter

import numpy as np
import pytest

from pipeline.shard.duplicates import chunk_drops, find_duplicates, hash_ranges
from pipeline.shard.errors import ShardError
from pipeline.shard.passes import LineSettings, count_chunk, deduplicate_chunk, encode_chunk, retokenize
from pipeline.shard.reader import Chunk, Reading
from pipeline.shard.vocabulary import build_vocabulary

SETTINGS = LineSettings(
    tokenizer="whitespace",
    moses_lang="en",
    lowercase=False,
    heldout_fraction=0.3,
    main_sources=1,
    reading=Reading(max_line_bytes=200),
)
DATA = "".join(f"line {i} of the {'big ' * (i % 4)}corpus\n" for i in range(60)).encode() + b"\n  \n"


def test_count_chunk_summarises_counts_and_keeps_the_sentences():
    summary, (tokens, counts), sentences, keys = count_chunk(Chunk(3, 0, DATA), SETTINGS)
    assert (summary.index, summary.source) == (3, 0) and keys is None  # no deduplication asked
    assert summary.stats == sentences.stats and summary.stats.lines == 62 and summary.stats.empty == 2
    train = sentences.tokens("train")
    assert dict(zip(tokens, counts.tolist(), strict=True)) == {
        t: sum(s.count(t) for s in train) for s in train for t in s
    }
    for split in ("train", "heldout"):
        assert summary.last_lengths[split] == len(sentences.tokens(split)[-1])
        assert summary.tokens(split).tokens == int(sentences.split(split).lengths.sum())


def test_writing_from_kept_or_retokenized_sentences_gives_the_same_pieces():
    chunk = Chunk(0, 0, DATA)
    summary, (tokens, counts), kept, _ = count_chunk(chunk, SETTINGS)
    vocab = build_vocabulary(dict(zip(tokens, counts.tolist(), strict=True)), summary.stats.train_sentences)
    offsets, shards = {"train": 0, "heldout": 0}, {"train": range(0, 2), "heldout": range(0, 1)}
    first = encode_chunk(kept, vocab.index, offsets, shards, 150)
    again = encode_chunk(retokenize(chunk, SETTINGS, summary.stats), vocab.index, offsets, shards, 150)
    assert sorted(first) == [("heldout", 0), ("train", 0), ("train", 1)]
    for key, piece in first.items():
        assert piece.lines == again[key].lines
        assert np.array_equal(piece.ids, again[key].ids) and np.array_equal(piece.lengths, again[key].lengths)
        index = vocab.index
        assert piece.ids.tolist() == [
            index.get(t, index["<UNK>"]) for line in piece.lines for t in line.decode().split()
        ]


def test_retokenize_refuses_an_input_that_changed():
    summary, _, _, _ = count_chunk(Chunk(5, 1, DATA), SETTINGS)
    changed = dataclasses.replace(summary.stats, train_tokens=summary.stats.train_tokens + 1)
    with pytest.raises(
        ShardError, match="input 1 changed between the counting and writing passes \\(chunk 5\\)"
    ):
        retokenize(Chunk(5, 1, DATA), SETTINGS, changed)


def test_deduplicating_a_chunk_takes_off_the_counts_of_what_went_and_only_that():
    settings = dataclasses.replace(SETTINGS, dedup=True, heldout_fraction=0.0)
    again = DATA.splitlines(keepends=True)[:7]
    data = DATA + b"".join(again)  # its first lines again
    summary, (tokens, counts), sentences, keys = count_chunk(Chunk(0, 0, data), settings)
    found = [find_duplicates([keys], lo, hi) for lo, hi in hash_ranges(summary.stats.train_sentences, 3)]
    after, (gone_tokens, gone), kept = deduplicate_chunk(sentences, 0, 0, chunk_drops(found, 0))
    total = Counter(dict(zip(tokens, counts.tolist(), strict=True)))
    total.update(dict(zip(gone_tokens, gone.tolist(), strict=True)))
    assert +total == Counter(dict(zip(*kept.train_counts(), strict=True)))
    assert (gone < 0).all() and after.stats.train_duplicates == len(again)
    assert kept.train.hashes is None and after.stats == kept.stats
    nothing = deduplicate_chunk(sentences, 0, 0, np.zeros(0, dtype=np.int64))
    assert nothing[1] is None and nothing[2].stats.train_sentences == summary.stats.train_sentences


def test_retokenize_blames_a_duplicates_file_that_names_other_sentences():
    """The same number of positions, but not the ones the run removed: the file is named, not the
    input (which is unchanged)."""
    settings = dataclasses.replace(SETTINGS, dedup=True, heldout_fraction=0.0)
    data = DATA + b"".join(DATA.splitlines(keepends=True)[:7])
    summary, _, sentences, keys = count_chunk(Chunk(0, 0, data), settings)
    found = [find_duplicates([keys], lo, hi) for lo, hi in hash_ranges(summary.stats.train_sentences, 3)]
    drops = chunk_drops(found, 0)
    after, _, kept = deduplicate_chunk(sentences, 0, 0, drops)
    again = retokenize(Chunk(0, 0, data), settings, after.stats, drops, "duplicates/00000.bin")
    assert np.array_equal(again.train.ids, kept.train.ids)
    others = drops - 30  # other sentences, of other lengths, as many
    with pytest.raises(
        ShardError,
        match=r"^duplicates/00000.bin does not hold the sentences the run removed from chunk 0 of 0 .*delete the output and rerun$",
    ):
        retokenize(Chunk(0, 0, data), settings, after.stats, others, "duplicates/00000.bin")
    with pytest.raises(ShardError, match="input 0 changed"):
        retokenize(Chunk(0, 0, data + b"one more\n"), settings, after.stats, drops, "duplicates/00000.bin")

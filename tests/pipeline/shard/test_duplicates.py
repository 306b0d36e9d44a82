"""Exact deduplication's pure parts: which copies go, whatever the chunking and hash ranges."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.formats.tokenizer import make_tokenizer
from pipeline.shard.duplicates import (
    chunk_drops,
    chunk_keys,
    decode_drops,
    encode_drops,
    find_duplicates,
    hash_ranges,
    line_bytes,
    remove_sentences,
)
from pipeline.shard.errors import ShardError
from pipeline.shard.sentences import tokenize_lines
from pipeline.shard.split import heldout_threshold, is_heldout

TOKENIZE = make_tokenizer("whitespace", "en", False)
FRACTION = 0.3


def corpus() -> list[str]:
    """Lines with copies near and far, copies that differ only in spacing (the same sentence once
    tokenized), a prefix of another sentence, empty lines, and non-ASCII text."""
    rng = np.random.default_rng(0)
    words = ["the", "lord", "spake", "unto", "moses", "saying", "café", "ünïcode", "a", "b"]
    pool = [" ".join(rng.choice(words, size=rng.integers(1, 7))) for _ in range(120)]
    lines = [pool[i] for i in rng.integers(0, len(pool), size=900)]
    lines += ["the  lord   spake", " the lord spake ", "the lord", "", "   "]
    rng.shuffle(lines)
    return lines


def chunked(lines: list[str], size: int, heldout_from: int | None = None) -> list:
    """The lines tokenized in chunks of ``size`` lines (those from ``heldout_from`` on all held out)."""
    chunks = []
    for start in range(0, len(lines), size):
        part = lines[start : start + size]
        data = ("\n".join(part) + "\n").encode("utf-8")
        held = heldout_from is not None and start >= heldout_from
        chunks.append(
            tokenize_lines(data, TOKENIZE, 0, heldout_threshold(FRACTION), all_heldout=held, keep_hashes=True)
        )
    return chunks


def deduplicate(chunks: list, ranges: list[tuple[int, int]]) -> list:
    keys = [chunk_keys(c) for c in chunks]
    found = [find_duplicates(keys, lo, hi) for lo, hi in ranges]
    return [remove_sentences(c, chunk_drops(found, i)) for i, c in enumerate(chunks)]


def kept_text(chunks: list, split: str) -> list[bytes]:
    return [line for c in chunks for line in c.split(split).lines()]


def expected(lines: list[str], heldout_from: int | None = None) -> dict[str, list[bytes]]:
    """The first copy of each sentence of each split, in corpus order: what `sort -u` keeps, in place."""
    seen: dict[str, set] = {"train": set(), "heldout": set()}
    out: dict[str, list[bytes]] = {"train": [], "heldout": []}
    for i, line in enumerate(lines):
        sentence = " ".join(line.split())
        if not sentence:
            continue
        forced = heldout_from is not None and i >= heldout_from
        split = "heldout" if forced or is_heldout(sentence, heldout_threshold(FRACTION)) else "train"
        if sentence not in seen[split]:
            seen[split].add(sentence)
            out[split].append(sentence.encode("utf-8"))
    return out


@pytest.mark.parametrize("size, workers", [(1000, 1), (97, 1), (97, 5), (13, 3), (1, 2)])
def test_the_first_copy_stays_whatever_the_chunks_and_hash_ranges(size, workers):
    lines = corpus()
    result = deduplicate(chunked(lines, size), hash_ranges(len(lines), workers))
    want = expected(lines)
    assert want["heldout"] and len(want["train"]) < 150  # the corpus has copies in both splits
    for split in ("train", "heldout"):
        assert kept_text(result, split) == want[split]
    for chunk in result:  # the arrays follow the text
        for split in ("train", "heldout"):
            part = chunk.split(split)
            assert part.lengths.tolist() == [len(line.split(b" ")) for line in part.lines()]
            tokens = [chunk.vocab[i] for i in part.ids.tolist()]
            assert tokens == [t for line in part.lines() for t in line.decode().split(" ")]


def test_the_stats_count_what_went_and_every_line_is_accounted_for():
    lines = corpus()
    before = chunked(lines, 200)
    after = deduplicate(before, hash_ranges(len(lines), 2))
    for old, new in zip(before, after, strict=True):
        s = new.stats
        assert s.lines == s.train_sentences + s.heldout_sentences + s.empty + s.overlong + (
            s.train_duplicates + s.heldout_duplicates
        )
        assert s.train_tokens + s.train_duplicate_tokens == old.stats.train_tokens
        assert s.heldout_tokens + s.heldout_duplicate_tokens == old.stats.heldout_tokens
        assert s.train_tokens == len(new.train.ids) and s.heldout_sentences == len(new.heldout.lengths)
        assert s.max_sentence_tokens == max(
            new.train.lengths.max(initial=0), new.heldout.lengths.max(initial=0)
        )
    want = expected(lines)
    for split in ("train", "heldout"):  # 903 sentences (two lines are empty): the rest are copies
        removed = sum(getattr(c.stats, f"{split}_duplicates") for c in after)
        assert removed == sum(getattr(c.stats, f"{split}_sentences") for c in before) - len(want[split])
    assert sum(c.stats.train_sentences + c.stats.heldout_sentences for c in before) == 903


def test_a_heldout_input_is_deduplicated_on_its_own_not_against_training():
    lines = ["in the beginning", "was the word", "in the beginning", "was the word", "and the word"]
    result = deduplicate(chunked(lines, 2, heldout_from=2), hash_ranges(len(lines), 1))
    assert kept_text(result, "heldout")[:2] == [b"in the beginning", b"was the word"]
    assert expected(lines, heldout_from=2)["heldout"] == kept_text(result, "heldout")


def test_hash_ranges_cover_the_hash_space_and_grow_with_the_corpus():
    for total, workers in [(0, 1), (10, 3), (9_000_000, 2)]:
        ranges = hash_ranges(total, workers)
        assert ranges[0][0] == 0 and ranges[-1][1] == 1 << 64
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert len(hash_ranges(9_000_000, 2)) == 3 and len(hash_ranges(10, 3)) == 3


def test_line_bytes_counts_utf8_bytes_of_each_line():
    [chunk] = chunked(["café au lait", "a", "ünï"], 10)
    both = np.concatenate([line_bytes(chunk.train), line_bytes(chunk.heldout)])
    assert sorted(both.tolist()) == sorted([len("café au lait".encode()), 1, len("ünï".encode())])


def test_positions_out_of_order_and_damaged_drop_files_are_refused():
    [chunk] = chunked(["a b", "c d", "e f"], 10)
    with pytest.raises(ShardError, match="out of order or beyond the chunk's 3 sentences"):
        remove_sentences(chunk, np.array([2, 1]))
    with pytest.raises(ShardError, match="out of order or beyond"):
        remove_sentences(chunk, np.array([3]))
    data = encode_drops(np.array([0, 2]))
    assert decode_drops(data, 2, "x").tolist() == [0, 2]
    with pytest.raises(ShardError, match=r"duplicates/chunk-000001.u32 holds 8 bytes, not the 3 positions"):
        decode_drops(data, 3, "duplicates/chunk-000001.u32")

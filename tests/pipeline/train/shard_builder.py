"""Shard directories of the shipped sample corpus for the trainer tests.

Tokens: words and punctuation split apart (a regex), so the sample's vocabulary stays small.
Written with the data tests' ``train_shards.write_shard_dir`` (the shard format's own encoder).
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from train_shards import write_shard_dir

from pipeline.formats import shard_format

_TOKEN = re.compile(r"\w+|[^\w\s]")
SAMPLE = Path(__file__).resolve().parents[3] / "pipeline" / "data" / "kjv-sample.txt.gz"


def sample_sentences(count: int) -> list[list[str]]:
    """The first ``count`` non-empty lines of the shipped sample corpus, tokenized."""
    sentences = []
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        for line in f:
            tokens = _TOKEN.findall(line)
            if tokens:
                sentences.append(tokens)
            if len(sentences) == count:
                break
    return sentences


def write_sample_shards(
    out: str,
    train: Sequence[list[str]],
    heldout: Sequence[list[str]],
    train_shards: int = 2,
    block_sentences: int = 200,
    min_count: int = 2,
) -> dict:
    """Vocabulary (words seen ``min_count`` times in ``train``), ``train_shards`` train shards and one
    held-out shard under ``out`` (local or s3); returns the manifest."""
    counts = Counter(t for s in train for t in s)
    words = [w for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_count]
    vocab = [*shard_format.SPECIALS, *words]
    per_shard = -(-len(train) // train_shards)

    def blocks(sentences):
        return [list(sentences[i : i + block_sentences]) for i in range(0, len(sentences), block_sentences)]

    splits = {
        "train": [blocks(train[s * per_shard : (s + 1) * per_shard]) for s in range(train_shards)],
        "heldout": [blocks(heldout)],
    }
    return write_shard_dir(out, splits, vocab)


def sample_shard_dir(out: str, count: int, heldout: int = 200) -> str:
    """Shards of the sample corpus's first ``count`` sentences under ``out``, the last ``heldout`` of
    them held out; returns ``out``."""
    sentences = sample_sentences(count)
    write_sample_shards(out, sentences[:-heldout], sentences[-heldout:])
    return out

"""Build small shard directories for the train-stage tests with the shard format's own encoder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from pipeline.formats import shard_format
from pipeline.formats.shard_manifest import ShardManifest, manifest_path
from pipeline.formats.unigram import (
    heldout_target_counts,
    targets_nll,
    training_target_counts,
    unigram_log_probs,
)
from pipeline.runtime import storage
from pipeline.train.char_cache import CharCache
from pipeline.train.data import LMBatch

FIXTURE_DIR = Path(__file__).resolve().parents[2] / "data" / "train"


def fixture_sentences() -> list[list[str]]:
    """bilm-tf's training fixture: 5 tokenized sentences (134 tokens)."""
    return [
        line.split() for line in (FIXTURE_DIR / "train_data.txt").read_text().splitlines() if line.strip()
    ]


def fixture_vocab() -> list[str]:
    """bilm-tf's 32-line training vocabulary (<S>, </S>, <UNK>, then by descending count)."""
    return (FIXTURE_DIR / "train_vocab.txt").read_text().split()


def write_shard_dir(
    root: str,
    splits: dict[str, list[list[list[list[str]]]]],
    vocab: list[str],
    counts: list[int] | None = None,
    score_heldout: bool = True,
) -> dict:
    """Write a shard directory under ``root`` (local or s3://) and return its manifest (typed).

    ``splits``: split name -> shards -> blocks -> sentences (token lists). OOV tokens get the
    ``<UNK>`` id. ``counts``: the vocab_counts.tsv column (default: counts over the train split).
    ``score_heldout``: record each held-out shard's ``unigram_nll`` as the shard stage does (False:
    a manifest of a shard stage from before it did).
    """
    index = {token: i for i, token in enumerate(vocab)}
    unk = index[shard_format.UNK]
    if counts is None:
        counts = [0] * len(vocab)
        for shard in splits.get("train", []):
            for block in shard:
                for sentence in block:
                    for token in sentence:
                        if token in index:
                            counts[index[token]] += 1
    storage.write_bytes(storage.join(root, shard_format.VOCAB_FILE), shard_format.encode_vocab(vocab))
    storage.write_bytes(
        storage.join(root, shard_format.COUNTS_FILE), shard_format.encode_counts(vocab, counts)
    )
    manifest: dict = {"shards": {}, "totals": {}}
    for split in shard_format.SPLITS:
        entries = []
        for s, shard in enumerate(splits.get(split, [])):
            name = shard_format.shard_name(split, s)
            with storage.open_write(storage.join(root, name)) as f:
                writer = shard_format.tar_writer(f)
                for b, block in enumerate(shard):
                    ids = [index.get(token, unk) for sentence in block for token in sentence]
                    writer.write(shard_format.encode_block(block, ids, shard_format.block_key(split, s, b)))
                writer.close()
            data = storage.read_bytes(storage.join(root, name))
            entries.append(
                {
                    "name": name,
                    "sentences": sum(len(block) for block in shard),
                    "tokens": sum(len(sentence) for block in shard for sentence in block),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        manifest["shards"][split] = entries
        manifest["totals"][split] = {
            "sentences": sum(e["sentences"] for e in entries),
            "tokens": sum(e["tokens"] for e in entries),
            "unk_tokens": sum(
                token not in index
                for shard in splits.get(split, [])
                for block in shard
                for sentence in block
                for token in sentence
            ),
        }
    if score_heldout:
        train = manifest["totals"]["train"]
        log_probs = unigram_log_probs(
            training_target_counts(np.array(counts), train["sentences"], train["tokens"])
        )
        for entry, shard in zip(manifest["shards"]["heldout"], splits.get("heldout", []), strict=True):
            ids = [index.get(token, unk) for block in shard for sentence in block for token in sentence]
            counts = heldout_target_counts([(np.array(ids, dtype=np.int64), entry["sentences"])], len(vocab))
            entry["unigram_nll"] = targets_nll(log_probs, counts)
    vocab_bytes = shard_format.encode_vocab(vocab)
    manifest["vocab"] = {
        "file": shard_format.VOCAB_FILE,
        "counts_file": shard_format.COUNTS_FILE,
        "size": len(vocab),
        "sha256": hashlib.sha256(vocab_bytes).hexdigest(),
    }
    storage.write_bytes(manifest_path(root), json.dumps(manifest).encode())
    return ShardManifest.of(manifest, root)


def many_shards_dir(root, vocab, n_shards=3, per_shard=7):
    """``n_shards`` train shards of distinct one-word-id-tagged sentences, 2 blocks each."""
    words = vocab[3:]
    shards = []
    for s in range(n_shards):
        sentences = [
            [words[(s * per_shard + j) % len(words)], f"oov{s}_{j}"] + ["of"] * (j % 3)
            for j in range(per_shard)
        ]
        shards.append([sentences[:3], sentences[3:]])
    write_shard_dir(root, {"train": shards, "heldout": [shards[0]]}, vocab)
    return [sentence for shard in shards for block in shard for sentence in block]


def source_sentences(source, n):
    """The next ``n`` sentences of a source as tuples of word ids (None entries when a test ends)."""
    out = []
    for _ in range(n):
        nxt = source.next_sentence()
        out.append(None if nxt is None else tuple(nxt[0].ids[nxt[1] : nxt[2]].tolist()))
    return out


def word_ids(words, vocab):
    """The vocabulary ids of ``words`` (``<UNK>`` for the others)."""
    index = {w: i for i, w in enumerate(vocab)}
    return [index.get(w, shard_format.UNK_ID) for w in words]


def synthetic_cache(vocab_size: int) -> CharCache:
    """The spellings of a vocabulary of the three specials and ``w0``, ``w1``, ... (``vocab_size`` in all)."""
    return CharCache([*shard_format.SPECIALS, *(f"w{i}" for i in range(vocab_size - 3))])


def zipf_batches(cache: CharCache, count: int, rows: int, unroll: int, seed: int = 0) -> list[LMBatch]:
    """``count`` batches of ``rows`` x ``unroll`` Zipf(1.3) word ids (3 and up), both directions,
    spelled by ``cache``: the repeats of real text without a corpus."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = np.minimum(rng.zipf(1.3, size=(2, rows, unroll + 1)) + 2, cache.vocab_size - 1)
        out.append(
            LMBatch(
                char_ids=torch.from_numpy(cache.spell(ids[..., :-1])),
                token_ids=torch.from_numpy(np.ascontiguousarray(ids[..., :-1])),
                targets=torch.from_numpy(np.ascontiguousarray(ids[..., 1:])),
            )
        )
    return out

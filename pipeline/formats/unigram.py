"""Held-out unigram perplexity under the training counts: the baseline logged beside the LM's.

It scores exactly the targets the LM predicts (docs/training.md#batching, docs/training.md#held-out-perplexity): every word, with out-of-vocabulary
words as ``<UNK>``, plus one end-of-sentence target per sentence (``</S>`` forward; the backward
LM predicts ``<S>`` instead with the same count, so both directions give the same unigram
perplexity and one number serves as the baseline for forward, backward and their average).

Training distribution over the V - 1 target types (every vocabulary entry but ``<S>``):
``c(w)`` from ``vocab_counts.tsv`` for words; ``c(</S>)`` = training sentences and
``c(<UNK>)`` = training tokens - sum of the vocabulary words' counts (both from the manifest, so
whatever the counts file lists for the specials is not relied on). Add-one smoothing:
``p(w) = (c(w) + 1) / (N + V - 1)`` with N the training target count, so words that never occur
in training (possible when the vocabulary came from elsewhere) keep a finite cost.

The shard stage scores each held-out shard as it writes it (:func:`targets_nll`, into the shard's
manifest record), so the manifest carries the baseline (``ShardManifest.unigram_perplexity``) and
planning a training run reads no shard. A manifest written before that is scored from its held-out
shards (:func:`heldout_unigram_perplexity`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pipeline.formats import shard_format
from pipeline.formats.shard_format import BOS_ID, EOS_ID, UNK_ID
from pipeline.formats.shard_manifest import ShardManifest

N_SPECIALS = len(shard_format.SPECIALS)


def training_target_counts(word_counts: np.ndarray, n_sentences: int, n_tokens: int) -> np.ndarray:
    """Counts of each forward target in the training split: int64 ``(V,)``.

    ``word_counts``: ``(V,)`` in vocabulary order; entries of the three specials are ignored.
    ``n_sentences`` / ``n_tokens``: the training split's totals (tokens = words, no boundaries).
    """
    counts = np.asarray(word_counts, dtype=np.int64).copy()
    if counts.ndim != 1 or counts.shape[0] < N_SPECIALS:
        raise ValueError(
            f"unigram: word counts must be a (V,) array with V >= {N_SPECIALS}, got {counts.shape}"
        )
    if (counts[N_SPECIALS:] < 0).any():
        raise ValueError("unigram: negative word count")
    unknown = n_tokens - int(counts[N_SPECIALS:].sum())
    if unknown < 0:
        raise ValueError(
            f"unigram: the vocabulary's counts sum to {int(counts[N_SPECIALS:].sum())}, more than the "
            f"{n_tokens} training tokens in the manifest"
        )
    counts[BOS_ID] = 0
    counts[EOS_ID] = n_sentences
    counts[UNK_ID] = unknown
    return counts


def unigram_log_probs(train_counts: np.ndarray) -> np.ndarray:
    """Add-one smoothed log-probabilities float64 ``(V,)`` over the V - 1 forward targets
    (``<S>`` gets -inf: it is never a forward target) from :func:`training_target_counts`."""
    counts = np.asarray(train_counts, dtype=np.float64)
    log_probs = np.log(counts + 1.0) - np.log(counts.sum() + counts.shape[0] - 1)
    log_probs[BOS_ID] = -np.inf
    return log_probs


def heldout_target_counts(blocks: Iterable[tuple[np.ndarray, int]], vocab_size: int) -> np.ndarray:
    """Counts of each forward target in a held-out set: int64 ``(V,)``.

    ``blocks``: ``(ids, n_sentences)`` pairs: word ids (int ``(n,)``, OOV already ``<UNK>``) and
    the number of sentences they form, each sentence adding one ``</S>`` target.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, n_sentences in blocks:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(
                f"unigram: held-out word ids {ids.min()}..{ids.max()} outside the vocabulary of {vocab_size}"
            )
        counts += np.bincount(ids, minlength=vocab_size)
        counts[EOS_ID] += n_sentences
    return counts


def targets_nll(log_probs: np.ndarray, heldout_counts: np.ndarray) -> float:
    """``-sum log p(target)`` over held-out targets counted by :func:`heldout_target_counts`, int
    ``(V,)``; ``log_probs``: float64 ``(V,)`` from :func:`unigram_log_probs`. One dot product in
    vocabulary order, so equal counts give equal bits however their sentences were ordered or cut."""
    heldout = np.asarray(heldout_counts, dtype=np.int64)
    if heldout.shape != np.shape(log_probs):
        raise ValueError(f"unigram: held-out counts {heldout.shape} vs training counts {np.shape(log_probs)}")
    if heldout[BOS_ID]:
        raise ValueError("unigram: <S> appears as a held-out target")
    mask = heldout > 0
    return float(-np.dot(heldout[mask].astype(np.float64), log_probs[mask]))


def unigram_perplexity(train_counts: np.ndarray, heldout_counts: np.ndarray) -> float:
    """``exp(-mean log p(target))`` over the held-out targets: both arguments int ``(V,)``."""
    total = int(np.asarray(heldout_counts, dtype=np.int64).sum())
    if total == 0:
        raise ValueError("unigram: the held-out set is empty")
    return float(np.exp(targets_nll(unigram_log_probs(train_counts), heldout_counts) / total))


def heldout_unigram_perplexity(manifest: ShardManifest) -> float:
    """The unigram perplexity of a shard directory's held-out split under its training counts:
    from the manifest when its shard stage recorded it, else by reading the held-out shards."""
    recorded = manifest.unigram_perplexity
    if recorded is not None:
        return recorded
    vocab = shard_format.read_vocab(manifest.vocab_path)
    pairs = shard_format.read_counts(manifest.counts_path)
    if [token for token, _ in pairs] != vocab:
        raise shard_format.FormatError(
            f"vocabulary counts {manifest.counts_path}: tokens differ from {manifest.vocab.file}"
        )
    train = manifest.totals["train"]
    train_counts = training_target_counts(
        np.array([count for _, count in pairs], dtype=np.int64), train.sentences, train.tokens
    )
    urls = manifest.urls("heldout")
    if not urls:
        raise ValueError(f"shard directory {manifest.folder}: the manifest lists no heldout shards")
    blocks = ((block.ids, len(block.lengths)) for url in urls for block in shard_format.read_shard(url))
    return unigram_perplexity(train_counts, heldout_target_counts(blocks, len(vocab)))

"""The shard stage's Kneser-Ney pass: the held-out baseline of the shards it just wrote
(the model: :mod:`pipeline.kneser_ney`; why: docs/training.md#baselines).

Ray tasks count the n-grams of each training shard (read back, checked against its sha256), then
merge the counts two at a time, the two smallest parts first, so that a merge's cost stays near
the size of its result; at most ``window`` tasks are unfinished at once. One last task estimates
the model and scores the held-out shards. Only the summary comes back to the driver.

Memory: the largest task holds the whole training split's n-grams twice over (the last merge's
two parts and its result); the measured figures per training token are in docs/training.md.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import ray

from pipeline import kneser_ney, storage
from pipeline.shard.writer import ShardRecord
from pipeline.shard_format import open_shard


@dataclass(frozen=True)
class _Shard:
    url: str
    sha256: str
    sentences: int
    tokens: int


def _sentences(shard: _Shard) -> tuple[np.ndarray, np.ndarray]:
    """A shard's word ids and sentence lengths, read and checked against its sha256."""
    ids, lengths = [], []
    with open_shard(shard.url, shard.sha256) as blocks:
        for block in blocks:
            ids.append(block.ids)
            lengths.append(block.lengths)
    if not lengths:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(ids), np.concatenate(lengths)


@ray.remote
def _count_task(shard: _Shard, order: int) -> kneser_ney.NgramCounts:
    return kneser_ney.count_ngrams(*_sentences(shard), order)


@ray.remote
def _merge_task(a: kneser_ney.NgramCounts, b: kneser_ney.NgramCounts) -> kneser_ney.NgramCounts:
    return kneser_ney.merge_counts(a, b)


@ray.remote
def _score_task(counts: kneser_ney.NgramCounts, heldout: Sequence[_Shard], vocab_size: int) -> dict:
    model = kneser_ney.build(counts, vocab_size)
    del counts
    nll, targets = 0.0, 0
    for shard in heldout:
        cost, n = model.score(*_sentences(shard))
        nll, targets = nll + cost, targets + n
    return {
        "order": model.order,
        "perplexity": kneser_ney.perplexity(nll, targets),
        "nll": nll,
        "targets": targets,
        "ngrams": model.ngrams,
        "discounts": [
            model.unigram_discounts[1:].tolist(),
            *(o.discounts[1:].tolist() for o in model.orders),
        ],
    }


def _shards(output: str, records: Sequence[ShardRecord]) -> list[_Shard]:
    return [_Shard(storage.join(output, r.name), r.sha256, r.sentences, r.tokens) for r in records]


def kneser_ney_baseline(
    output: str,
    shards: Mapping[str, Sequence[ShardRecord]],
    vocab_size: int,
    order: int,
    window: int,
    on_counted: Callable[[int, int], None],
    get: Callable = ray.get,
) -> dict | None:
    """The manifest's ``baselines.kneser_ney`` record for the shards of ``output`` (``shards``:
    split -> records, as the manifest lists them), or None without held-out sentences.
    ``on_counted(sentences, tokens)`` after each training shard is counted; ``get``: ``ray.get``
    or the stage's variant that re-raises its own errors as themselves."""
    heldout = [s for s in _shards(output, shards["heldout"]) if s.sentences]
    if not heldout:
        return None
    todo = list(reversed(_shards(output, shards["train"])))
    ready: list[tuple[int, int, ray.ObjectRef]] = []  # (tokens, tie-break, counts): smallest first
    running: dict[ray.ObjectRef, tuple[int, _Shard | None]] = {}
    tie = itertools.count()
    while todo or running or len(ready) > 1:
        while len(ready) > 1 and len(running) < window:
            (a_tokens, _, a), (b_tokens, _, b) = heapq.heappop(ready), heapq.heappop(ready)
            running[_merge_task.remote(a, b)] = (a_tokens + b_tokens, None)
        while todo and len(running) < window:
            shard = todo.pop()
            running[_count_task.remote(shard, order)] = (shard.tokens, shard)
        if not running:
            continue
        (done,), _ = ray.wait(list(running), num_returns=1, fetch_local=False)
        tokens, shard = running.pop(done)
        if shard is not None:
            on_counted(shard.sentences, shard.tokens)
        heapq.heappush(ready, (tokens, next(tie), done))
    return get(_score_task.remote(ready[0][2], heldout, vocab_size))

"""The shard stage's Kneser-Ney pass: the held-out baseline of the shards it just wrote (the
model and its partitions: :mod:`pipeline.formats.kneser_ney`; why: docs/training.md#baselines).

Ray tasks, at most ``window`` unfinished at once:

1. count: a group of training shards each (read back, checked against their sha256), cut into
   the partitions (``kneser_ney.parts_for``: from the corpus size alone);
2. merge: a partition's counts two at a time, the two smallest first, so that a merge costs about
   the size of its result;
3. adjust: a partition's adjusted counts, and its share of the global statistics;
4. statistics: the unigram and the discounts, from every partition's share;
5. score: a partition's model, and the held-out targets whose previous word is in it.

Only the small numbers of steps 4 and 5 come to the driver. A task holds one partition at most
(its last merge: two halves and the result), so the memory per task is bounded by the number of
partitions rather than by the corpus.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import ray

from pipeline.formats import arpa, kneser_ney
from pipeline.formats.shard_format import open_shard
from pipeline.runtime import storage
from pipeline.shard.writer import ShardRecord

GROUP_TOKENS = 8_000_000
"""Most training tokens a count task reads (fewer where the cluster's tasks would sit idle): each
of its results is an object per partition, so larger groups keep the objects few on a large corpus."""


@dataclass(frozen=True)
class _Shard:
    url: str
    sha256: str
    sentences: int
    tokens: int


def _sentences(shards: Sequence[_Shard]) -> tuple[np.ndarray, np.ndarray]:
    """The shards' word ids and sentence lengths, each shard read and checked against its sha256."""
    ids, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
    for shard in shards:
        with open_shard(shard.url, shard.sha256) as blocks:
            for block in blocks:
                ids.append(block.ids)
                lengths.append(block.lengths)
    return np.concatenate(ids), np.concatenate(lengths)


@ray.remote
def _count_task(shards: Sequence[_Shard], order: int, parts: int):
    counts = kneser_ney.split_counts(kneser_ney.count_ngrams(*_sentences(shards), order), parts)
    return counts[0] if parts == 1 else tuple(counts)


@ray.remote
def _merge_task(a: kneser_ney.NgramCounts, b: kneser_ney.NgramCounts) -> kneser_ney.NgramCounts:
    return kneser_ney.merge_counts(a, b)


@ray.remote(num_returns=2)
def _adjust_task(counts: kneser_ney.NgramCounts, vocab_size: int):
    """-> (the partition's adjusted tables, its share of the global statistics)"""
    adjusted = kneser_ney.adjust(counts, vocab_size)
    share = kneser_ney.Adjusted((), adjusted.counts_of_counts, adjusted.continuation)
    return adjusted, share


@ray.remote(num_returns=2)
def _statistics_task(*shares: kneser_ney.Adjusted):
    """-> (the global statistics, their summary for the manifest)"""
    statistics = kneser_ney.global_statistics(shares)
    summary = {
        "unigrams": int((statistics.unigram_counts > 0).sum()),
        "discounts": statistics.discounts[:, 1:].tolist(),
    }
    return statistics, summary


@ray.remote
def _model_task(
    adjusted: kneser_ney.Adjusted, statistics: kneser_ney.GlobalStatistics
) -> kneser_ney.PartModel:
    return kneser_ney.estimate(adjusted, statistics)


@ray.remote
def _score_task(
    model: kneser_ney.PartModel,
    statistics: kneser_ney.GlobalStatistics,
    heldout: Sequence[_Shard],
    part: int,
    parts: int,
) -> tuple[float, int, list[int]]:
    """-> (-sum ln p of the partition's held-out targets, their number, its n-grams per order)"""
    vocab_size = statistics.unigram.shape[0]
    targets = kneser_ney.Targets.of(*_sentences(heldout), len(model.orders) + 1, vocab_size).part(parts, part)
    return kneser_ney.part_cost(model, targets, statistics), int(targets.words.shape[0]), model.ngrams


@ray.remote
def _backoffs_task(model: kneser_ney.PartModel, parts: int):
    """-> per partition p, the backoffs of this one's histories that p writes (arpa.history_backoffs)"""
    pieces = arpa.history_backoffs(model, parts)
    return pieces[0] if parts == 1 else tuple(pieces)


@ray.remote
def _arpa_task(model, statistics, tokens_box: list, part: int, parts: int, *backoffs):
    """-> the partition's ARPA sections, order 1..N, each a gzip member (arpa.part_sections)"""
    tokens = arpa.arpa_tokens(ray.get(tokens_box[0]))
    sections = arpa.part_sections(model, statistics, tokens, part, parts, backoffs)
    return sections[0] if len(sections) == 1 else tuple(sections)


def _shards(output: str, records: Sequence[ShardRecord]) -> list[_Shard]:
    return [_Shard(storage.join(output, r.name), r.sha256, r.sentences, r.tokens) for r in records]


def _groups(shards: list[_Shard], window: int) -> list[list[_Shard]]:
    """Consecutive shards, up to ``GROUP_TOKENS`` each, and at least ``window`` groups where there
    are as many shards."""
    limit = max(1, min(GROUP_TOKENS, sum(s.tokens for s in shards) // max(1, window)))
    groups: list[list[_Shard]] = [[]]
    for shard in shards:
        if groups[-1] and sum(s.tokens for s in groups[-1]) + shard.tokens > limit:
            groups.append([])
        groups[-1].append(shard)
    return groups


def _merged_partitions(
    groups: list[list[_Shard]], order: int, parts: int, window: int, on_counted: Callable[[int, int], None]
) -> list[ray.ObjectRef]:
    """Count every group and merge each partition down to one object: its ref, per partition."""
    todo = groups[::-1]
    ready: list[list[tuple[int, int, ray.ObjectRef]]] = [
        [] for _ in range(parts)
    ]  # per partition, smallest first
    running: dict[
        ray.ObjectRef, tuple[int, int, list[_Shard] | None]
    ] = {}  # ref -> (partition, tokens, group)
    tie = itertools.count()
    while todo or running or any(len(heap) > 1 for heap in ready):
        for part, heap in enumerate(ready):
            while len(heap) > 1 and len(running) < window:
                (a_tokens, _, a), (b_tokens, _, b) = heapq.heappop(heap), heapq.heappop(heap)
                running[_merge_task.remote(a, b)] = (part, a_tokens + b_tokens, None)
        while todo and len(running) < window:
            group = todo.pop()
            refs = _count_task.options(num_returns=parts).remote(group, order, parts)
            tokens = sum(s.tokens for s in group)
            for part, ref in enumerate([refs] if parts == 1 else refs):
                running[ref] = (part, tokens, group if part == 0 else None)
        if not running:
            continue
        (done,), _ = ray.wait(list(running), num_returns=1, fetch_local=False)
        part, tokens, group = running.pop(done)
        if group is not None:
            on_counted(sum(s.sentences for s in group), tokens)
        heapq.heappush(ready[part], (tokens, next(tie), done))
    return [heap[0][2] for heap in ready]


def kneser_ney_baseline(
    output: str,
    shards: Mapping[str, Sequence[ShardRecord]],
    vocab: Sequence[str],
    order: int,
    window: int,
    on_counted: Callable[[int, int], None],
    get: Callable = ray.get,
    write_arpa: bool = False,
) -> dict | None:
    """The manifest's ``baselines.kneser_ney`` record for the shards of ``output`` (``shards``:
    split -> records, as the manifest lists them), or None without held-out sentences.
    ``on_counted(sentences, tokens)`` after each group of training shards is counted; ``get``:
    ``ray.get`` or the stage's variant that re-raises its own errors as themselves; ``write_arpa``:
    also write the model as :data:`ARPA_FILE` (its record under ``arpa``)."""
    heldout = [s for s in _shards(output, shards["heldout"]) if s.sentences]
    if not heldout:
        return None
    train = _shards(output, shards["train"])
    parts = kneser_ney.parts_for(sum(s.tokens for s in train), order)
    merged = _merged_partitions(_groups(train, window), order, parts, window, on_counted)
    adjusted = [_adjust_task.remote(ref, len(vocab)) for ref in merged]
    del merged
    statistics, summary = _statistics_task.remote(*(share for _, share in adjusted))
    models = [_model_task.remote(tables, statistics) for tables, _ in adjusted]
    del adjusted
    scored = get([_score_task.remote(model, statistics, heldout, p, parts) for p, model in enumerate(models)])
    summary = get(summary)
    nll = float(sum(cost for cost, _, _ in scored))  # in partition order: the same sum on every run
    targets = sum(n for _, n, _ in scored)
    record = {
        "order": order,
        "perplexity": kneser_ney.perplexity(nll, targets),
        "nll": nll,
        "targets": targets,
        "ngrams": [summary["unigrams"], *np.sum([n for _, _, n in scored], axis=0).tolist()],
        "discounts": summary["discounts"],
        "partitions": parts,
    }
    if write_arpa:
        ngrams = [len(vocab), *record["ngrams"][1:]]  # every vocabulary entry is a unigram line
        record["arpa"] = _write_arpa(output, models, statistics, vocab, ngrams, get)
    return record


ARPA_FILE = "kneser_ney.arpa.gz"
"""The baseline's model as an ARPA file (``kneser_ney_arpa=true``): pipeline/formats/arpa.py."""


def _write_arpa(output: str, models: list, statistics, vocab: Sequence[str], ngrams: list[int], get) -> dict:
    """Every partition's sections, streamed into :data:`ARPA_FILE` one at a time (the driver holds
    one section at most): its record, ``{"file", "bytes", "sha256"}``."""
    parts, order = len(models), len(ngrams)
    backoffs = [_backoffs_task.options(num_returns=parts).remote(model, parts) for model in models]
    backoffs = [[pieces] if parts == 1 else pieces for pieces in backoffs]
    tokens_box = [ray.put(list(vocab))]
    sections = [
        _arpa_task.options(num_returns=order).remote(
            model, statistics, tokens_box, p, parts, *(backoffs[q][p] for q in range(parts))
        )
        for p, model in enumerate(models)
    ]
    sections = [[refs] if order == 1 else refs for refs in sections]
    path = storage.join(output, ARPA_FILE)
    with storage.open_write(path) as raw:
        out = storage.HashingWriter(raw)
        for member in arpa.assemble(arpa.header(ngrams), sections):
            out.write(member if isinstance(member, bytes) else get(member))
    return {"file": ARPA_FILE, "bytes": out.size, "sha256": out.hexdigest()}

"""The shard stage's Kneser-Ney pass: the held-out baseline of the shards it just wrote (the
model and its partitions: :mod:`pipeline.formats.kneser_ney`; why: docs/training.md#baselines).

Ray tasks, at most ``window`` unfinished at once, in three steps with a barrier between them; what
passes from one step to the next is files on storage (:mod:`pipeline.shard.sorted_runs`), never
objects in Ray's store, so nothing there grows with the corpus:

1. count: a group of training shards each (read back, checked against their sha256), its n-grams
   cut into the partitions (``kneser_ney.parts_for``: from the corpus size alone), each written as
   a sorted run;
2. adjust: a partition each: its runs merged in one k-way merge, its adjusted counts written, its
   runs deleted; it returns its share of the global statistics (counts of counts, continuation
   counts: small), from which one task makes the unigram and the discounts;
3. score: a partition each: its model estimated from its adjusted counts, and the held-out targets
   whose previous word is in it scored (the held-out split is read once, its targets cut into the
   partitions by one task). With ``write_arpa``, a last step writes each partition's ARPA sections.

A task holds one group or one partition: memory per task follows ``GROUP_TOKENS`` and
``kneser_ney.PART_BYTES``, not the corpus; storage holds the runs, then the adjusted counts (about
12 bytes an n-gram each), until the pass ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import ray

from pipeline.formats import arpa, kneser_ney
from pipeline.formats.shard_format import open_shard
from pipeline.runtime import storage
from pipeline.shard import sorted_runs
from pipeline.shard.task_window import TaskWindow, get
from pipeline.shard.writer import ShardRecord

GROUP_TOKENS = 8_000_000
"""Most training tokens a count task reads (fewer where the cluster's tasks would sit idle): each
writes a run per partition, so larger groups keep the runs few on a large corpus."""


@dataclass(frozen=True)
class _Shard:
    url: str
    sha256: str
    sentences: int
    tokens: int


@dataclass(frozen=True)
class BaselinePlan:
    """What the pass needs to know. ``output``: the shard output (its scratch files go in
    ``sorted_runs.SCRATCH_FOLDER`` there); ``order``: N; ``vocab_size``: V; ``parts``: the
    partitions; ``window``: most Ray tasks unfinished at once; ``write_arpa``: also write the model
    as :data:`ARPA_FILE`."""

    output: str
    order: int
    vocab_size: int
    parts: int
    window: int
    write_arpa: bool = False

    def path(self, name: str) -> str:
        return storage.join(self.output, name)


def _sentences(shards: Sequence[_Shard]) -> tuple[np.ndarray, np.ndarray]:
    """The shards' word ids and sentence lengths, each shard read and checked against its sha256."""
    ids, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int32)]
    for shard in shards:
        with open_shard(shard.url, shard.sha256) as blocks:
            for block in blocks:
                ids.append(block.ids)
                lengths.append(block.lengths)
    return np.concatenate(ids), np.concatenate(lengths)


def write_runs(plan: BaselinePlan, group: int, ids: np.ndarray, lengths: np.ndarray) -> None:
    """Count sentences (``ids`` ``(sum(lengths),)``, ``lengths`` ``(S,)``) and write their n-grams
    as group ``group``'s sorted run of each partition."""
    counts = kneser_ney.count_ngrams(ids, lengths, plan.order)
    for part, piece in enumerate(kneser_ney.split_counts(counts, plan.parts)):
        tables = [piece.top, *piece.starts]
        sorted_runs.write_tables(plan.path(sorted_runs.counts_name(group, part)), tables, piece.tokens)


@ray.remote
def _runs_task(plan: BaselinePlan, group: int, shards: Sequence[_Shard]) -> None:
    write_runs(plan, group, *_sentences(shards))


def _merged_runs(plan: BaselinePlan, names: Sequence[str]) -> kneser_ney.NgramCounts:
    """A partition's sorted runs, read and merged order by order: each order's runs are let go
    once concatenated (``kneser_ney.merge_runs``), so the peak is one copy of them and the sort."""
    runs: list[list[kneser_ney.Table]] = [[] for _ in range(plan.order - 1)]  # the top order first
    tokens = 0
    for name in names:
        tables, part_tokens = sorted_runs.read_tables(plan.path(name))
        if len(tables) != plan.order - 1:
            raise kneser_ney.BaselineError(
                f"kneser-ney: {name} holds {len(tables)} tables, not {plan.order - 1}"
            )
        for k, table in enumerate(tables):
            runs[k].append(table)
        tokens += part_tokens
        del tables
    merged = [kneser_ney.merge_runs(order_runs) for order_runs in runs]
    return kneser_ney.NgramCounts(plan.order, merged[0], tuple(merged[1:]), tokens)


def adjust_partition(plan: BaselinePlan, part: int, groups: int) -> kneser_ney.Adjusted:
    """Merge partition ``part``'s runs of ``groups`` groups, write its adjusted counts and delete the
    runs: its share of the global statistics (no tables: those are on storage)."""
    names = [sorted_runs.counts_name(group, part) for group in range(groups)]
    counts = _merged_runs(plan, names)
    adjusted = kneser_ney.adjust(counts, plan.vocab_size)
    del counts
    sorted_runs.write_tables(plan.path(sorted_runs.adjusted_name(part)), adjusted.tables)
    for name in names:
        storage.delete(plan.path(name))
    return kneser_ney.Adjusted((), adjusted.counts_of_counts, adjusted.continuation)


_adjust_task = ray.remote(adjust_partition)


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
def _targets_task(plan: BaselinePlan, heldout: Sequence[_Shard]):
    """-> per partition, the held-out targets whose previous word is in it"""
    targets = kneser_ney.Targets.of(*_sentences(heldout), plan.order, plan.vocab_size)
    pieces = [targets.part(plan.parts, p) for p in range(plan.parts)]
    return pieces[0] if plan.parts == 1 else tuple(pieces)


def partition_model(plan: BaselinePlan, part: int, statistics) -> kneser_ney.PartModel:
    """Partition ``part``'s model, from the adjusted counts :func:`adjust_partition` wrote."""
    tables, _ = sorted_runs.read_tables(plan.path(sorted_runs.adjusted_name(part)))
    return kneser_ney.estimate(tables, statistics)


@ray.remote
def _score_task(plan: BaselinePlan, part: int, statistics, targets: kneser_ney.Targets):
    """-> ((-sum ln p of the partition's held-out targets, their number, its n-grams per order),
    then with ``plan.write_arpa`` per partition p the backoffs of its histories that p writes)"""
    model = partition_model(plan, part, statistics)
    scored = (kneser_ney.part_cost(model, targets, statistics), int(targets.words.shape[0]), model.ngrams)
    if not plan.write_arpa:
        return scored
    return (scored, *arpa.history_backoffs(model, plan.parts))


@ray.remote
def _arpa_task(plan: BaselinePlan, part: int, statistics, tokens_box: list, *backoffs):
    """-> the partition's ARPA sections, order 1..N, each a gzip member (arpa.part_sections)"""
    model = partition_model(plan, part, statistics)
    tokens = arpa.arpa_tokens(ray.get(tokens_box[0]))
    sections = arpa.part_sections(model, statistics, tokens, part, plan.parts, backoffs)
    return sections[0] if len(sections) == 1 else tuple(sections)


def _refs(refs) -> list:
    """A task's refs as a list, whether it has one result or several."""
    return list(refs) if isinstance(refs, list | tuple) else [refs]


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


class BaselineProgress(Protocol):
    """The pass's progress (pipeline/shard/progress.py's ``BaselineBars``)."""

    def counted(self, sentences: int, tokens: int) -> None:
        """After each group of training shards is counted."""

    def partition(self) -> None:
        """After each partition's adjust step, then after each one's score step."""


def kneser_ney_baseline(
    plan: BaselinePlan,
    shards: Mapping[str, Sequence[ShardRecord]],
    vocab: Sequence[str],
    progress: BaselineProgress,
) -> dict | None:
    """The manifest's ``baselines.kneser_ney`` record for the shards of ``plan.output``
    (``shards``: split -> records, as the manifest lists them), or None without held-out
    sentences. With ``plan.write_arpa`` the record's ``arpa`` names the model's ARPA file."""
    heldout = [s for s in _shards(plan.output, shards["heldout"]) if s.sentences]
    if not heldout:
        return None
    sorted_runs.clear(plan.output)  # a run that stopped halfway left its own
    groups = _groups(_shards(plan.output, shards["train"]), plan.window)
    window = TaskWindow(
        plan.window,
        lambda g, _: progress.counted(sum(s.sentences for s in groups[g]), sum(s.tokens for s in groups[g])),
    )
    for g, group in enumerate(groups):
        window.add(_runs_task.remote(plan, g, group), tag=g)
    window.drain()
    window = TaskWindow(plan.window, lambda _, __: progress.partition())
    shares = []
    for p in range(plan.parts):
        shares.append(_adjust_task.remote(plan, p, len(groups)))
        window.add(shares[-1], tag=p)
    window.drain()
    statistics, summary = _statistics_task.remote(*shares)
    del shares
    targets = _targets_task.options(num_returns=plan.parts).remote(plan, heldout)
    targets = [targets] if plan.parts == 1 else targets
    returns = 1 + plan.parts * plan.write_arpa  # with the ARPA file: the backoffs for each partition
    scored = []
    for p, mine in enumerate(targets):
        scored.append(_refs(_score_task.options(num_returns=returns).remote(plan, p, statistics, mine)))
        window.add(scored[-1][0], tag=p)
    window.drain()
    del targets
    costs = get([refs[0] for refs in scored])
    summary = get(summary)
    nll = float(sum(cost for cost, _, _ in costs))  # in partition order: the same sum on every run
    targets_scored = sum(n for _, n, _ in costs)
    record = {
        "order": plan.order,
        "perplexity": kneser_ney.perplexity(nll, targets_scored),
        "nll": nll,
        "targets": targets_scored,
        "ngrams": [summary["unigrams"], *np.sum([n for _, _, n in costs], axis=0).tolist()],
        "discounts": summary["discounts"],
        "partitions": plan.parts,
    }
    if plan.write_arpa:
        ngrams = [len(vocab), *record["ngrams"][1:]]  # every vocabulary entry is a unigram line
        backoffs = [refs[1:] for refs in scored]
        record["arpa"] = _write_arpa(plan, statistics, backoffs, vocab, ngrams)
    sorted_runs.clear(plan.output)
    return record


ARPA_FILE = "kneser_ney.arpa.gz"
"""The baseline's model as an ARPA file (``kneser_ney_arpa=true``): pipeline/formats/arpa.py."""


def _write_arpa(
    plan: BaselinePlan, statistics, backoffs: list, vocab: Sequence[str], ngrams: list[int]
) -> dict:
    """Every partition's sections, streamed into :data:`ARPA_FILE` one at a time (the driver holds
    one section at most; ``backoffs[q][p]``: partition q's backoffs for p): its record,
    ``{"file", "bytes", "sha256"}``."""
    parts, order = plan.parts, len(ngrams)
    tokens_box = [ray.put(list(vocab))]
    sections = [
        _arpa_task.options(num_returns=order).remote(
            plan, p, statistics, tokens_box, *(backoffs[q][p] for q in range(parts))
        )
        for p in range(parts)
    ]
    sections = [_refs(refs) for refs in sections]
    path = plan.path(ARPA_FILE)
    with storage.open_write(path) as raw:
        out = storage.HashingWriter(raw)
        for member in arpa.assemble(arpa.header(ngrams), sections):
            out.write(member if isinstance(member, bytes) else get(member))
    return {"file": ARPA_FILE, "bytes": out.size, "sha256": out.hexdigest()}

"""The Kneser-Ney pass's steps without Ray: the model they make through sorted runs on storage is the
one-process model, and a step's memory follows its partition, not the corpus."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pipeline.formats import kneser_ney
from pipeline.shard import sorted_runs
from pipeline.shard.baseline import BaselinePlan, adjust_partition, partition_model, write_runs

V = 5000


def _sentences(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Zipf-like word ids 3..V-1, lengths 0..29."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 30, size=count)
    weights = 1.0 / np.arange(1, V - 2)
    ids = rng.choice(np.arange(3, V), size=int(lengths.sum()), p=weights / weights.sum())
    return ids.astype(np.int32), lengths.astype(np.int32)


def _groups(ids: np.ndarray, lengths: np.ndarray, groups: int):
    """The corpus cut into ``groups`` consecutive groups of sentences."""
    ends = np.cumsum(lengths)
    for chunk in np.array_split(np.arange(lengths.shape[0]), groups):
        start = int(ends[chunk[0]] - lengths[chunk[0]])
        yield ids[start : int(ends[chunk[-1]])], lengths[chunk]


def _write(plan: BaselinePlan, ids, lengths, groups: int) -> None:
    for group, (g_ids, g_lengths) in enumerate(_groups(ids, lengths, groups)):
        write_runs(plan, group, g_ids, g_lengths)


@pytest.mark.parametrize(("order", "parts"), [(3, 1), (3, 4), (4, 3)])
def test_the_model_through_sorted_runs_is_the_one_process_model(tmp_path, order, parts):
    ids, lengths = _sentences(0, 3000)
    plan = BaselinePlan(str(tmp_path), order, V, parts, window=2)
    _write(plan, ids, lengths, groups=5)
    shares = [adjust_partition(plan, p, groups=5) for p in range(parts)]
    assert sorted(p.name for p in (tmp_path / "kneser_ney").iterdir()) == [
        f"adjusted-p{p:04d}.tables" for p in range(parts)
    ]  # each partition's runs are gone once merged
    statistics = kneser_ney.global_statistics(shares)
    heldout = _sentences(1, 300)
    targets = kneser_ney.Targets.of(*heldout, order, V)
    nll = sum(
        kneser_ney.part_cost(partition_model(plan, p, statistics), targets.part(parts, p), statistics)
        for p in range(parts)
    )
    whole = kneser_ney.build(kneser_ney.count_ngrams(ids, lengths, order), V)
    assert nll == pytest.approx(whole.score(*heldout)[0], rel=1e-12)
    np.testing.assert_array_equal(statistics.discounts, whole.statistics.discounts)
    sorted_runs.clear(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _peak(step) -> int:
    tracemalloc.start()
    try:
        step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_partitions_memory_follows_its_size_not_the_corpus(tmp_path):
    ids, lengths = _sentences(2, 40_000)  # about 580k tokens
    statistics = kneser_ney.global_statistics(
        [kneser_ney.adjust(kneser_ney.count_ngrams(ids, lengths, 3), V)]
    )
    peaks = {}
    for parts in (1, 8):
        plan = BaselinePlan(str(tmp_path / str(parts)), 3, V, parts, window=2)
        _write(plan, ids, lengths, groups=6)
        adjusted = _peak(lambda plan=plan: adjust_partition(plan, 0, groups=6))
        estimated = _peak(lambda plan=plan: partition_model(plan, 0, statistics))
        peaks[parts] = (adjusted, estimated)
    # an eighth of the corpus's n-grams per partition: well under a quarter of the memory
    assert peaks[8][0] < peaks[1][0] / 4 and peaks[8][1] < peaks[1][1] / 4, peaks

"""Word sense from one layer: the nearest sense centroid (Peters et al. 2018, Table 5).

For each polysemous lemma (with its part of speech) of the probe set, each example's target token
vector is compared with the centroid of each of the lemma's senses, computed from the lemma's other
examples (leave one out: the example never sees itself), by cosine similarity; the nearest sense is
the prediction. An example is scored when its sense has another example (most WordNet senses have
one, whose centroid is gone once it is left out: such an example is only a competitor for the
others). Baseline: the most frequent of the lemma's senses (by SemCor's counts, WordNet's sense
order) among those with examples, on the same scored examples.

Ties back off to the most frequent sense, as the paper's evaluation backs off to WordNet's first
sense: senses within ``TIE`` of the nearest are equally near. The char CNN's layer is context-free,
so every example of a lemma spelled the same way has the same vector and every centroid the same
direction: without the back-off the prediction was float rounding and the alphabetical order of
the sense names, a different figure on another machine for the same model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

TIE = 1e-5
"""Cosine similarities this close are a tie: far above what float32 features computed in another
order (another machine, thread count or batch) move a cosine by, far below the gaps between senses
that a layer tells apart."""


@dataclass(frozen=True)
class WsdResult:
    layers: dict[str, float]
    """Accuracy per layer (``"0"``, ``"1"``, ...)."""
    baseline: float
    test: int
    """Examples scored."""


def nearest_sense(
    vectors: np.ndarray, senses: Sequence[str], rank: Mapping[str, int] | None = None
) -> np.ndarray:
    """One lemma's examples, (E, D) and their senses: the predicted sense of each (leave one out),
    as an index into ``sorted(set(senses))``; of senses tied within ``TIE``, the most frequent
    (lowest ``rank``, then the first name).

    The cosine with a centroid is the cosine with the sum of its unit vectors, so each example is
    compared with every sense's sum, its own sense's sum less itself (a sense it is the only example
    of has no centroid left: never predicted for it)."""
    names = sorted(set(senses))
    labels = np.array([names.index(s) for s in senses])
    units = vectors.astype(np.float64)
    units /= np.maximum(np.linalg.norm(units, axis=1, keepdims=True), 1e-12)
    sums = np.zeros((len(names), units.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, units)
    counts = np.bincount(labels, minlength=len(names))
    dots = units @ sums.T  # (E, K)
    similarity = dots / np.maximum(np.linalg.norm(sums, axis=1), 1e-12)
    rows = np.arange(len(units))
    own_dot = dots[rows, labels] - 1.0  # the sum less the example itself
    own_norm = np.sqrt(
        np.maximum(np.square(np.linalg.norm(sums[labels], axis=1)) - 2 * dots[rows, labels] + 1.0, 0)
    )
    similarity[rows, labels] = np.where(counts[labels] > 1, own_dot / np.maximum(own_norm, 1e-12), -np.inf)
    tied = similarity >= similarity.max(axis=1, keepdims=True) - TIE
    frequency = np.array([rank[name] for name in names] if rank is not None else range(len(names)))
    order = np.argsort(frequency, kind="stable")  # most frequent first; equal ranks by name
    return order[np.argmax(tied[:, order], axis=1)]


def probe_wsd(
    features: np.ndarray, lemmas: Sequence[str], senses: Sequence[str], ranks: Sequence[int]
) -> WsdResult:
    """Accuracy per layer; ``features`` (examples, L, D): each example's target token. Scored: the
    examples whose sense has another example (a centroid to be nearest to: in WordNet most senses
    have one example, which can only compete, never be found)."""
    groups: dict[str, list[int]] = {}
    for i, lemma in enumerate(lemmas):
        groups.setdefault(lemma, []).append(i)
    correct = np.zeros(features.shape[1], dtype=np.int64)
    baseline = scored = 0
    for members in groups.values():
        own = [senses[i] for i in members]
        names = sorted(set(own))
        truth = np.array([names.index(s) for s in own])
        reachable = np.bincount(truth, minlength=len(names))[truth] > 1
        if not reachable.any():
            continue
        scored += int(reachable.sum())
        rank = {senses[i]: ranks[i] for i in members}
        for layer in range(features.shape[1]):
            predicted = nearest_sense(features[members, layer], own, rank)
            correct[layer] += int(((predicted == truth) & reachable).sum())
        first = names.index(min(names, key=lambda s: rank[s]))
        baseline += int(((truth == first) & reachable).sum())
    total = max(scored, 1)
    layers = {str(layer): float(correct[layer] / total) for layer in range(features.shape[1])}
    return WsdResult(layers, baseline / total, scored)

"""The word-sense probe (pipeline/probe/wsd_probe.py): nearest sense centroids on hand-made vectors,
leave one out, and the most-frequent-sense baseline."""

from __future__ import annotations

import numpy as np

from pipeline.probe.wsd_probe import nearest_sense, probe_wsd


def test_each_example_goes_to_the_nearest_centroid_of_the_others():
    vectors = np.array([[1, 0.1], [1, -0.1], [0.9, 0], [0, 1], [0.1, 1], [-0.1, 0.9]], dtype=np.float32)
    assert nearest_sense(vectors, ["a", "a", "a", "b", "b", "b"]).tolist() == [0, 0, 0, 1, 1, 1]
    # leave one out: a sense's only example cannot find its own sense
    assert nearest_sense(np.array([[1, 0], [0, 1], [0.1, 1]], np.float32), ["a", "b", "b"]).tolist() == [
        1,
        1,
        1,
    ]
    # the last example is nearer the other sense's centroid than its own (the sense's other example)
    crossed = np.array([[1, 0], [1, 0.05], [0, 1], [0.98, 0.1]], np.float32)
    assert nearest_sense(crossed, ["a", "a", "b", "b"]).tolist() == [0, 0, 1, 0]


def test_accuracy_per_layer_and_the_most_frequent_sense():
    good = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]], dtype=np.float32)  # senses apart
    bad = np.array([[1, 0], [0, 1], [1, 0.1], [0.1, 1]], dtype=np.float32)  # senses crossed
    features = np.stack([bad, good], axis=1)  # (4 examples, 2 layers, 2)
    result = probe_wsd(features, ["run.v"] * 4, ["s1", "s1", "s2", "s2"], [2, 2, 1, 1])
    assert result.layers == {"0": 0.0, "1": 1.0} and result.test == 4
    assert result.baseline == 0.5  # s2 is the most frequent sense (rank 1): right for two of four


def test_an_example_whose_sense_has_no_other_example_is_not_scored():
    # s3's one example can only compete; the four others are scored
    vectors = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1], [0.7, 0.7]], dtype=np.float32)[:, None]
    result = probe_wsd(vectors, ["bank.n"] * 5, ["s1", "s1", "s2", "s2", "s3"], [1, 1, 2, 2, 3])
    assert result.test == 4 and result.layers == {"0": 1.0} and result.baseline == 0.5


def test_a_context_free_layer_backs_off_to_the_most_frequent_sense_whatever_the_rounding():
    """Every example of a lemma spelled the same way has the same vector in the char CNN's layer:
    every centroid points the same way and the nearest is float rounding. Such ties go to the most
    frequent sense, the same on every machine, thread count and order of the examples."""
    rng = np.random.default_rng(0)
    word = rng.standard_normal(64).astype(np.float32)
    senses = ["bank.n.02", "bank.n.01", "bank.n.02", "bank.n.01", "bank.n.02", "bank.n.03", "bank.n.03"]
    ranks = {"bank.n.03": 1, "bank.n.01": 2, "bank.n.02": 3}  # the most frequent is not the first name
    for trial in range(20):  # rounding noise of another machine: a few ulps on each copy
        noise = rng.standard_normal((len(senses), 64)).astype(np.float32) * np.float32(1e-7) * (trial > 0)
        vectors = word[None, :] * (1 + noise)
        order = rng.permutation(len(senses)) if trial > 1 else np.arange(len(senses))
        names = sorted(set(senses))
        predicted = nearest_sense(vectors[order], [senses[i] for i in order], ranks)
        assert {names[p] for p in predicted} == {"bank.n.03"}, trial
    features = np.repeat(word[None, None, :], len(senses), axis=0)
    result = probe_wsd(features, ["bank.n"] * len(senses), senses, [ranks[s] for s in senses])
    assert result.layers["0"] == result.baseline == 2 / 7  # scored: all 7; right: the 2 of bank.n.03


def test_senses_apart_by_more_than_the_tie_are_told_apart():
    vectors = np.array([[1, 0], [1, 0.05], [0, 1], [0.02, 1]], dtype=np.float32)
    ranks = {"a": 2, "b": 1}  # b the most frequent: ties would go to it, these are no ties
    assert nearest_sense(vectors, ["a", "a", "b", "b"], ranks).tolist() == [0, 0, 1, 1]

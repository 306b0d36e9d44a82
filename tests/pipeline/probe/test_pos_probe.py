"""The part-of-speech probe's classifier (pipeline/probe/pos_probe.py) against a plain reference, and
its baseline on a hand-made example."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.probe.pos_probe import LinearProbe, most_frequent_tag, probe_pos


def _toy(rng, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Three classes, each a Gaussian blob in 4 dimensions."""
    centres = np.array([[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]], dtype=np.float32)
    labels = rng.integers(0, 3, count)
    return (centres[labels] + rng.normal(0, 0.7, (count, 4))).astype(np.float32), labels


def _reference(features: np.ndarray, labels: np.ndarray, classes: int, l2: float, steps: int = 3000):
    """Multinomial logistic regression by plain gradient descent in numpy (float64): (W, b)."""
    weights, bias = np.zeros((features.shape[1], classes)), np.zeros(classes)
    onehot = np.eye(classes)[labels]
    for _ in range(steps):
        logits = features @ weights + bias
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        grad = (probs - onehot) / len(labels)
        weights -= 0.5 * (features.T @ grad + 2 * l2 * weights)
        bias -= 0.5 * grad.sum(0)
    return weights, bias


def test_the_classifier_learns_what_a_plain_logistic_regression_learns():
    rng = np.random.default_rng(0)
    (x_train, y_train), (x_test, y_test) = _toy(rng, 600), _toy(rng, 300)
    probe = LinearProbe(4, 3).fit(torch.from_numpy(x_train), torch.from_numpy(y_train))
    with torch.no_grad():
        ours = probe(torch.from_numpy(x_test)).argmax(-1).numpy()
    weights, bias = _reference(x_train.astype(np.float64), y_train, 3, l2=1e-4)
    plain = np.argmax(x_test @ weights + bias, axis=1)
    assert (plain == y_test).mean() > 0.9
    assert (ours == plain).mean() >= 0.97  # the same classifier, up to the last few points on the margins
    assert abs((ours == y_test).mean() - (plain == y_test).mean()) <= 0.02


def test_the_mix_finds_the_one_informative_layer():
    rng = np.random.default_rng(1)
    x, y = _toy(rng, 900)
    noise = rng.normal(0, 1, (900, 4)).astype(np.float32)
    layers = np.stack([noise, x, noise[::-1].copy()], axis=1)  # (N, 3, 4): only layer 1 tells
    words = [str(i % 7) for i in range(900)]
    tags = [str(label) for label in y]
    result = probe_pos(layers[:600], tags[:600], layers[600:], tags[600:], words[:600], words[600:])
    assert result.layers["1"] > 0.9 and result.layers["0"] < 0.6 and result.layers["2"] < 0.6
    assert result.layers["mix"] > 0.85 and (result.train, result.test) == (600, 300)


def test_the_baseline_tags_each_word_with_its_most_frequent_tag():
    train_words = ["the", "run", "run", "run", "dog"]
    train_tags = ["at", "vb", "nn", "vb", "nn"]
    # run -> vb (2 of 3), dog -> nn, an unseen word -> the most frequent tag overall (vb and nn tie
    # at 2: vb, seen first), wrong for cat here
    test = ["run", "dog", "cat", "the"]
    assert most_frequent_tag(train_words, train_tags, test, ["vb", "nn", "nn", "at"]) == 0.75

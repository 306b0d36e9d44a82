"""Part of speech from one layer (or a learned mix of all): a linear classifier on frozen vectors.

The paper's probe (Peters et al. 2018, Table 6): multinomial logistic regression on a layer's token
vectors, trained on the training split, accuracy on the test split; the mix is ELMo's own
``ScalarMix`` (softmax-normalised layer weights and a scale) trained with the classifier. Trained
full-batch with L-BFGS from zeros in float32 with a small L2 penalty: deterministic, no learning
rate to tune. Baseline: each word's most frequent training tag, the most frequent tag overall for a
word never seen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model import ScalarMix

ITERATIONS = 60
L2 = 1e-4


@dataclass(frozen=True)
class PosResult:
    layers: dict[str, float]
    """Test accuracy per layer (``"0"``, ``"1"``, ...) and of the mix (``"mix"``)."""
    baseline: float
    train: int
    test: int
    """Tokens."""


def _labels(train_tags: Sequence[str], test_tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    classes = {tag: i for i, tag in enumerate(sorted(set(train_tags)))}
    unseen = len(classes)  # a tag the training split never shows: never predicted, counted wrong
    train = np.array([classes[t] for t in train_tags], dtype=np.int64)
    test = np.array([classes.get(t, unseen) for t in test_tags], dtype=np.int64)
    return train, test, len(classes)


class LinearProbe(torch.nn.Module):
    """Logits of ``classes`` from (N, D) features, or from (N, L, D) through a ``ScalarMix``."""

    def __init__(self, width: int, classes: int, layers: int = 0):
        super().__init__()
        self.linear = torch.nn.Linear(width, classes)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.mix = ScalarMix(layers) if layers else None

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(self.mix(list(features.unbind(1))) if self.mix is not None else features)

    def fit(self, features: torch.Tensor, labels: torch.Tensor) -> LinearProbe:
        """Minimum mean cross-entropy + L2 on the weights, full batch, L-BFGS from zeros."""
        optimizer = torch.optim.LBFGS(
            self.parameters(), max_iter=ITERATIONS, history_size=20, line_search_fn="strong_wolfe"
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self(features), labels)
            loss = loss + L2 * self.linear.weight.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        return self

    def accuracy(self, features: torch.Tensor, labels: torch.Tensor) -> float:
        with torch.no_grad():
            return float((self(features).argmax(-1) == labels).float().mean())


def probe_pos(
    train_features: np.ndarray,
    train_tags: Sequence[str],
    test_features: np.ndarray,
    test_tags: Sequence[str],
    train_words: Sequence[str],
    test_words: Sequence[str],
) -> PosResult:
    """Accuracy of a classifier per layer and of a mix; ``*_features`` (tokens, L, D) float32,
    ``*_tags`` / ``*_words`` one per token."""
    y_train, y_test, classes = _labels(train_tags, test_tags)
    x_train, x_test = torch.from_numpy(train_features), torch.from_numpy(test_features)
    labels, truth = torch.from_numpy(y_train), torch.from_numpy(y_test)
    layers, width = x_train.shape[1], x_train.shape[2]
    accuracy: dict[str, float] = {}
    for layer in range(layers):
        train, test = x_train[:, layer].contiguous(), x_test[:, layer].contiguous()
        accuracy[str(layer)] = LinearProbe(width, classes).fit(train, labels).accuracy(test, truth)
    accuracy["mix"] = LinearProbe(width, classes, layers).fit(x_train, labels).accuracy(x_test, truth)
    baseline = most_frequent_tag(train_words, train_tags, test_words, test_tags)
    return PosResult(accuracy, baseline, len(y_train), len(y_test))


def most_frequent_tag(
    train_words: Sequence[str], train_tags: Sequence[str], test_words: Sequence[str], test_tags: Sequence[str]
) -> float:
    """Accuracy of tagging each test word with its most frequent training tag (ties: the tag seen
    first), a word never seen with the most frequent tag overall."""
    per_word: dict[str, Counter] = {}
    for word, tag in zip(train_words, train_tags, strict=True):
        per_word.setdefault(word, Counter())[tag] += 1
    overall = Counter(train_tags).most_common(1)[0][0]
    guesses = [per_word[w].most_common(1)[0][0] if w in per_word else overall for w in test_words]
    return float(np.mean([g == t for g, t in zip(guesses, test_tags, strict=True)]))

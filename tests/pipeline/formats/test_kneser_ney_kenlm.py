"""The Kneser-Ney baseline against KenLM's ``lmplz``, the standard estimator, on the same text: the
same n-grams per order and the same probability for every held-out target (KenLM's query module)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.formats import kneser_ney

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

SAMPLE = Path(__file__).resolve().parents[3] / "pipeline" / "data" / "kjv-sample.txt.gz"


@pytest.fixture(scope="module")
def text() -> tuple[list[str], list[str]]:
    """Training and held-out sentences: real verses (Zipfian, as a corpus is), training repeating
    some (duplicates), held-out ones with words training never saw and one-word sentences."""
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        verses = [" ".join(next(f).split()) for _ in range(3300)]
    train = verses[:3000] + verses[:40]
    heldout = verses[3000:] + ["Zerubbabel's quokka", "selah", "amen", "quokka quokka quokka"]
    return train, heldout


def ids_and_lengths(sentences: list[str], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    tokens = [s.split(" ") for s in sentences]
    ids = np.array([index.get(t, 2) for sentence in tokens for t in sentence], dtype=np.int32)
    return ids, np.array([len(sentence) for sentence in tokens], dtype=np.int32)


@pytest.mark.parametrize("order", [2, 3, 4, 5])
def test_counts_and_every_heldout_targets_probability_are_kenlms(kenlm, text, order, tmp_path):
    train, heldout = text
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    stderr = kenlm.estimate(tmp_path / "train.txt", order, tmp_path / "model.arpa", tmp_path)
    arpa_counts = [
        int(n) for n in re.findall(r"^ngram \d+=(\d+)$", (tmp_path / "model.arpa").read_text(), re.M)
    ]
    theirs = kenlm.query_module().Model(str(tmp_path / "model.arpa"))
    their_log10 = np.array([lp for s in heldout for lp, _, _ in theirs.full_scores(s, bos=True, eos=True)])

    vocab = ["<S>", "</S>", "<UNK>", *sorted({t for s in train for t in s.split(" ")})]
    index = {t: i for i, t in enumerate(vocab)}
    model = kneser_ney.build(kneser_ney.count_ngrams(*ids_and_lengths(train, index), order), len(vocab))
    ours = np.log10(model.target_probabilities(*ids_and_lengths(heldout, index)))

    # KenLM lists <s> and <unk> among its unigrams; ours counts the targets seen in training
    assert model.ngrams == [arpa_counts[0] - 2, *arpa_counts[1:]]
    assert ours.shape == their_log10.shape == (sum(len(s.split(" ")) + 1 for s in heldout),)
    assert np.abs(ours - their_log10).max() < 1e-5
    nll, targets = model.score(*ids_and_lengths(heldout, index))
    their_perplexity = 10 ** (-their_log10.sum() / targets)
    assert kneser_ney.perplexity(nll, targets) == pytest.approx(their_perplexity, rel=1e-6)
    # the discounts too (lmplz prints each order's)
    printed = re.findall(r"^(\d) \d+ D1=(\S+) D2=(\S+) D3\+=(\S+)$", stderr, re.M)
    assert len(printed) == order
    for n, *d in printed:
        assert model.statistics.discounts[int(n) - 1][1:] == pytest.approx([float(x) for x in d], rel=1e-5)

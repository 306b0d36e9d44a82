"""The Kneser-Ney model as an ARPA file, read back by KenLM: the model's probabilities (to the
format's 7 digits) and lmplz's own file's n-gram counts, whatever the partitions."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.formats import arpa, kneser_ney

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

SAMPLE = Path(__file__).resolve().parents[3] / "pipeline" / "data" / "kjv-sample.txt.gz"


@pytest.fixture(scope="module")
def text() -> tuple[list[str], list[str]]:
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        verses = [" ".join(next(f).split()) for _ in range(2200)]
    return verses[:2000], verses[2000:] + ["Zerubbabel's quokka", "amen"]


def _encode(sentences: list[str], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    tokens = [s.split(" ") for s in sentences]
    ids = np.array([index.get(t, 2) for sentence in tokens for t in sentence], dtype=np.int32)
    return ids, np.array([len(sentence) for sentence in tokens], dtype=np.int32)


def write_arpa(model: kneser_ney.KneserNey, vocab: list[str], path: Path) -> None:
    parts = len(model.parts)
    backoffs = [arpa.history_backoffs(m, parts) for m in model.parts]
    tokens = arpa.arpa_tokens(vocab)
    sections = [
        arpa.part_sections(m, model.statistics, tokens, p, parts, [held[p] for held in backoffs])
        for p, m in enumerate(model.parts)
    ]
    path.write_bytes(b"".join(arpa.assemble(arpa.header([len(vocab), *model.ngrams[1:]]), sections)))


@pytest.mark.parametrize("order, parts", [(2, 1), (3, 1), (3, 4), (5, 3)])
def test_kenlm_reads_the_models_probabilities_back(kenlm, text, order, parts, tmp_path):
    train, heldout = text
    vocab = ["<S>", "</S>", "<UNK>", *sorted({t for s in train for t in s.split(" ")})]
    index = {t: i for i, t in enumerate(vocab)}
    model = kneser_ney.build(kneser_ney.count_ngrams(*_encode(train, index), order), len(vocab), parts)
    write_arpa(model, vocab, tmp_path / "ours.arpa.gz")
    read_back = kenlm.query_module().Model(str(tmp_path / "ours.arpa.gz"))
    log10 = np.array([lp for s in heldout for lp, _, _ in read_back.full_scores(s, bos=True, eos=True)])
    assert np.abs(log10 - np.log10(model.target_probabilities(*_encode(heldout, index)))).max() < 3e-6
    # the n-grams lmplz lists for the same text, order by order, <s> and <unk> included
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    kenlm.estimate(tmp_path / "train.txt", order, tmp_path / "lmplz.arpa", tmp_path)
    header = re.compile(r"^ngram \d+=(\d+)$", re.M)
    ours = header.findall(gzip.decompress((tmp_path / "ours.arpa.gz").read_bytes()).decode())
    assert ours == header.findall((tmp_path / "lmplz.arpa").read_text())


def test_the_file_names_the_specials_as_kenlm_does_and_never_predicts_the_start():
    vocab = ["<S>", "</S>", "<UNK>", "a", "b"]
    ids = np.array([3, 4, 3, 3, 4], dtype=np.int32)
    model = kneser_ney.build(kneser_ney.count_ngrams(ids, np.array([2, 3], dtype=np.int32), 2), len(vocab))
    backoffs = arpa.history_backoffs(model.parts[0], 1)
    sections = [
        arpa.part_sections(model.parts[0], model.statistics, arpa.arpa_tokens(vocab), 0, 1, [backoffs[0]])
    ]
    lines = gzip.decompress(b"".join(arpa.assemble(arpa.header([5, *model.ngrams[1:]]), sections))).decode()
    assert lines.startswith("\\data\\\nngram 1=5\nngram 2=") and lines.endswith("\n\\end\\\n")
    unigrams = lines.split("\\1-grams:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split("\t")[1] for line in unigrams] == ["<s>", "</s>", "<unk>", "a", "b"]
    assert unigrams[0].split("\t")[0] == "-99" and len(unigrams[0].split("\t")) == 3  # <s> is a history

"""benchmarks/synthetic_corpus.py: deterministic, exact in size, shaped like the 1B Word Benchmark."""

from __future__ import annotations

import gzip
from collections import Counter

import numpy as np

from benchmarks.synthetic_corpus import PUNCTUATION, write_corpus


def test_a_small_corpus_is_deterministic_exact_and_benchmark_shaped(tmp_path):
    a, b, c = tmp_path / "a.txt.gz", tmp_path / "b.txt.gz", tmp_path / "c.txt"
    write_corpus(a, 200_000, 20_000, seed=3, block_tokens=50_000)
    write_corpus(b, 200_000, 20_000, seed=3, block_tokens=50_000)
    write_corpus(c, 200_000, 20_000, seed=4, block_tokens=50_000)
    text = gzip.decompress(a.read_bytes())
    assert text == gzip.decompress(b.read_bytes()) and text != c.read_bytes()
    lines = text.decode().split("\n")
    assert lines[-1] == "" and all(line.strip() == line and line for line in lines[:-1])
    tokens = [t for line in lines[:-1] for t in line.split(" ")]
    assert len(tokens) == 200_000 and all(tokens)
    lengths = np.array([len(line.split(" ")) for line in lines[:-1]])
    assert 24 < lengths.mean() < 30 and lengths.max() > 80  # a long tail
    counts = Counter(tokens)
    ranked = [n for _, n in counts.most_common()]
    assert 0.02 < ranked[0] / len(tokens) < 0.1  # Zipf-Mandelbrot: p(1) = (1 / 3.7) / sum_r 1 / (r + 2.7)
    assert ranked[9] < ranked[0] / 2 and len(counts) > 8_000  # p(10) / p(1) = 3.7 / 12.7
    assert {"."} <= set(counts) and sum(counts[p] for p in PUNCTUATION) > 0.02 * len(tokens)
    assert any(t[0].isupper() for t in counts) and any(t[0].isdigit() for t in counts)

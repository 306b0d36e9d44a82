"""The Kneser-Ney baseline as an ARPA file: the n-gram model format that KenLM, SRILM and speech
decoders read, gzip-compressed.

Each listed n-gram carries its interpolated log10 probability and, where it is itself a history of
the next order, the log10 of the mass that history leaves to the order below (its backoff): the
same numbers that KenLM's ``lmplz`` writes for the same model, so reading the file back gives the
model's probabilities (to the 7 significant digits the format keeps). The vocabulary's specials are
written as KenLM spells them: ``<s>`` (probability ``-99``: never predicted), ``</s>``, ``<unk>``.

A model estimated in partitions (:mod:`pipeline.formats.kneser_ney`) is written in pieces: each
partition writes its own n-grams of every order (:func:`part_sections`), and the file is the
header, then per order its heading and every partition's lines (:func:`assemble`). Every piece is a
gzip member of its own; gzip readers read concatenated members as one stream, so the pieces are
joined as bytes, never decompressed again.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence

import numpy as np

from pipeline.formats.kneser_ney import GlobalStatistics, PartModel, sorted_lookup
from pipeline.formats.shard_format import BOS_ID

SPECIALS = {"<S>": "<s>", "</S>": "</s>", "<UNK>": "<unk>"}
"""The shard vocabulary's specials as KenLM names them."""
NEVER = -99.0
"""The log10 probability ARPA gives a word that is never predicted (``<s>``)."""


def arpa_tokens(vocab: Sequence[str]) -> np.ndarray:
    """The vocabulary as the file names its words, object ``(V,)``."""
    return np.array([SPECIALS.get(t, t) for t in vocab], dtype=object)


def _history_words(model: PartModel, k: int, index: np.ndarray) -> list[np.ndarray]:
    """The words of histories ``index`` among the partition's histories of ``k + 1`` words, oldest
    first: ``k + 1`` int64 arrays like ``index``."""
    vocab_size = model.vocab_size
    keys = model.histories[k][index]
    words = []
    for level in range(k, 0, -1):  # a history's key: (its newer words' index) * V + its oldest word
        words.append(keys % vocab_size)
        keys = model.histories[level - 1][keys // vocab_size]
    words.append(keys)
    return words


def history_backoffs(model: PartModel, parts: int) -> list[list[tuple[list[np.ndarray], np.ndarray]]]:
    """The backoffs this partition holds, sent where their n-grams are written: ``[p][n - 2]`` =
    ``(words, log10 backoff)`` of its histories of n words (n = 2 .. N - 1; words oldest first)
    whose second-to-last word falls in partition ``p``. (A history of n words is held by the
    partition of its last word, but written as an n-gram by the partition of the word before.)"""
    out: list[list[tuple[list[np.ndarray], np.ndarray]]] = [[] for _ in range(parts)]
    for n in range(2, len(model.orders) + 1):
        count = model.histories[n - 1].shape[0]
        words = _history_words(model, n - 1, np.arange(count, dtype=np.int64))
        backoff = np.log10(model.orders[n - 1].gamma)
        where = words[-2] % parts
        for p in range(parts):
            mine = where == p
            out[p].append(([w[mine] for w in words], backoff[mine]))
    return out


def _join(known: Sequence[tuple[list[np.ndarray], np.ndarray]], rows: list[np.ndarray]) -> np.ndarray:
    """The value of each of ``rows`` (columns of words) among ``known`` (pieces of columns and
    values, each row there once), NaN where it is not there."""
    width = len(rows)
    columns = [np.concatenate([*(piece[0][c] for piece in known), rows[c]]) for c in range(width)]
    values = np.concatenate([*(piece[1] for piece in known), np.full(rows[0].shape, np.nan)])
    offset = values.shape[0] - rows[0].shape[0]
    asked = np.arange(values.shape[0]) >= offset
    order = np.lexsort((asked, *columns[::-1]))  # by words, a known row before the asked one
    same = np.ones(max(order.shape[0] - 1, 0), dtype=bool)
    for column in columns:
        ranked = column[order]
        same &= ranked[1:] == ranked[:-1]
    hit = np.flatnonzero(same & asked[order][1:] & ~asked[order][:-1]) + 1
    found = np.full(rows[0].shape, np.nan)
    found[order[hit] - offset] = values[order[hit - 1]]
    return found


def _lines(tokens: np.ndarray, words: list[np.ndarray], log10p: np.ndarray, backoff: np.ndarray) -> bytes:
    if not log10p.shape[0]:
        return b""
    names = tokens[words[0]]
    for column in words[1:]:
        names = names + " " + tokens[column]
    lines = np.char.mod("%.7g", log10p).astype(object) + "\t" + names
    has = ~np.isnan(backoff)
    lines[has] = lines[has] + "\t" + np.char.mod("%.7g", backoff[has]).astype(object)
    return ("\n".join(lines.tolist()) + "\n").encode("utf-8")


def part_sections(
    model: PartModel,
    statistics: GlobalStatistics,
    tokens: np.ndarray,
    part: int,
    parts: int,
    backoffs: Sequence[Sequence[tuple[list[np.ndarray], np.ndarray]]],
) -> list[bytes]:
    """Partition ``part``'s lines of every order 1..N, each a gzip member. Its unigrams are the words
    ``w % parts == part`` (their backoffs are its own); its n-grams of order 2..N those whose
    previous word is in it, their backoffs from ``backoffs``: every partition's
    :func:`history_backoffs` for this one (``[q][n - 2]``)."""
    vocab_size = statistics.unigram.shape[0]
    words = np.arange(part, vocab_size, parts, dtype=np.int64)
    with np.errstate(divide="ignore"):
        log10p = np.where(words == BOS_ID, NEVER, np.log10(statistics.unigram[words]))
    unigram_backoff = np.full(words.shape, np.nan)
    if model.orders:
        index = sorted_lookup(model.histories[0], words)
        unigram_backoff[index >= 0] = np.log10(model.orders[0].gamma[index[index >= 0]])
    sections = [_lines(tokens, [words], log10p, unigram_backoff)]
    order = len(model.orders) + 1
    for n, level in enumerate(model.orders, start=2):
        history = _history_words(model, n - 2, level.keys // vocab_size)
        ngram = [*history, level.keys % vocab_size]
        previous = [history[-1 - k] if k < n - 1 else np.full(level.keys.shape, -1) for k in range(order - 1)]
        p = model.probabilities(ngram[-1], previous, statistics.unigram[ngram[-1]])
        backoff = _join([q[n - 2] for q in backoffs], ngram) if n < order else np.full(p.shape, np.nan)
        sections.append(_lines(tokens, ngram, np.log10(p), backoff))
    return [gzip.compress(section, compresslevel=6, mtime=0) for section in sections]


def header(ngrams_per_order: Sequence[int]) -> list[bytes]:
    """The file's text around the sections, as gzip members: before order 1's lines (the counts),
    before each higher order's, and the end: ``N + 1`` members."""
    counts = "".join(f"ngram {n}={count}\n" for n, count in enumerate(ngrams_per_order, start=1))
    texts = [f"\\data\\\n{counts}\n\\1-grams:\n"]
    texts += [f"\n\\{n}-grams:\n" for n in range(2, len(ngrams_per_order) + 1)]
    texts.append("\n\\end\\\n")
    return [gzip.compress(t.encode("utf-8"), mtime=0) for t in texts]


def assemble(head: Sequence[bytes], parts: Sequence[Sequence[bytes]]) -> list[bytes]:
    """The members of the whole file in order: ``head`` from :func:`header`, ``parts[p][k]`` the
    partitions' sections of order k + 1 (anything bytes-like that the caller streams)."""
    members: list[bytes] = []
    for k, heading in enumerate(head[:-1]):
        members.append(heading)
        members.extend(part[k] for part in parts)
    members.append(head[-1])
    return members

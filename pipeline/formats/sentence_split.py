"""Documents -> sentences, one per line: how a record corpus (Parquet, JSON Lines) becomes the
sentence-per-line text the stages read.

The splitter is Bling Fire's (``blingfire.text_to_sentences``), chosen by
``benchmarks/sentence_splitters.py``
(docs/benchmarks.md#sentence-splitters-for-documents-benchmarkssentence_splitterspy): on the Brown corpus's
documents it has the best F1 of the maintained libraries (0.993 against the Moses splitter's 0.991,
sentencex's 0.913 and pySBD's 0.858) at 1.7M words/s on one core, 18x the Moses splitter's speed.
It has one model, for text in Latin and similar scripts, and no language setting.

A blank line (a paragraph break) always ends a sentence, because a heading or a list item without a
full stop would otherwise run into the next paragraph; a single newline is a space (text wrapped at
a fixed width). The output holds no newline inside a sentence, so it is sentence-per-line text as it
stands. The split of a document depends on that document alone: a rerun, or another worker, splits
it the same way, which is what lets a sentence be found again by (record, sentence index).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


@functools.cache
def _splitter():
    import blingfire  # imported on first use: a run over sentence-per-line text never loads its library

    return blingfire.text_to_sentences


def split_document(text: str) -> list[str]:
    """The sentences of one document, in order; none for a blank one."""
    split = _splitter()
    sentences: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text) if "\n" in text else (text,):
        found = split(paragraph)
        if not found and paragraph.strip():
            # the library answers '' when its buffer is too small (it never should be, at twice the
            # input): the paragraph stays one sentence rather than being lost
            found = " ".join(paragraph.split())
        if found:
            sentences.extend(found.split("\n"))
    return sentences


def document_sentences(texts: Sequence[str], split: bool) -> tuple[list[str], np.ndarray]:
    """``(sentences, sentences_per_document)``: every document's sentences, in order, and int64
    ``(D,)`` how many each became. ``split=False`` makes each document one sentence (its newlines
    become spaces): records that already hold one sentence each."""
    if not split:
        return [text.replace("\n", " ") for text in texts], np.ones(len(texts), dtype=np.int64)
    parts: list[str] = []
    counts = np.zeros(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):  # once per document: the splitter takes one text a call
        sentences = split_document(text)
        counts[i] = len(sentences)
        parts.extend(sentences)
    return parts, counts


def document_lines(texts: Sequence[str], split: bool) -> tuple[str, np.ndarray]:
    """:func:`document_sentences` as sentence-per-line text (``\n`` after every line)."""
    sentences, counts = document_sentences(texts, split)
    return ("\n".join(sentences) + "\n" if sentences else ""), counts

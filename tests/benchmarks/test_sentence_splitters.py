"""The sentence-splitter benchmark's bookkeeping: Brown's tokens back as print, its units as
printed sentences, and boundaries scored by where they fall (the libraries themselves are not the
project's dependencies: a splitter of this test's own stands in)."""

from __future__ import annotations

import re

import pytest

from benchmarks.sentence_splitters import _ends, detokenize, measure, orthographic


def test_brown_tokens_read_as_print():
    tokens = "`` Only a handful was received '' , the jury said , `` considering the size '' .".split()
    assert detokenize(tokens) == '"Only a handful was received", the jury said, "considering the size".'
    assert detokenize("won by Ivan Allen Jr. .".split()) == "won by Ivan Allen Jr."
    assert detokenize("it is n't ( yet ) $ 5 .".split()) == "it isn't (yet) $5."


def test_a_unit_that_ends_no_printed_sentence_joins_the_next():
    units = ["Merger proposed", "The jury said so.", "Two clauses;", 'and a quote."', "Why?"]
    assert orthographic(units) == [
        "Merger proposed The jury said so.",
        'Two clauses; and a quote."',
        "Why?",
    ]


def test_boundaries_are_scored_where_they_fall_whatever_the_spacing():
    gold = ["Dr. Smith came.", "He sat."]
    text = " ".join(gold)
    assert _ends(gold, text) == {len("Dr.Smithcame.")}  # the document's end is no decision

    def naive(text: str) -> list[str]:  # splits after "Dr." too
        return re.split(r"(?<=\.)\s+", text)

    score = measure(naive, [gold, ["One.", "Two."]]).row()
    assert score["recall"] == 1.0 and score["precision"] == pytest.approx(2 / 3)
    assert score["exact"] == pytest.approx(3 / 4)  # "He sat.", "One.", "Two." of the four

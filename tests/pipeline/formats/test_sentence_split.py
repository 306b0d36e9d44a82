import numpy as np

from pipeline.formats.sentence_split import document_lines, split_document


def test_a_document_splits_at_sentence_ends_not_at_abbreviations_or_wrapped_lines():
    text = (
        "Mr. Brown met Dr. Smith at 5 p.m. yesterday. The U.S. Army paid $3.50 each!\nHe wrapped\nhis lines."
    )
    assert split_document(text) == [
        "Mr. Brown met Dr. Smith at 5 p.m. yesterday.",
        "The U.S. Army paid $3.50 each!",
        "He wrapped his lines.",
    ]


def test_a_blank_line_ends_a_sentence_without_a_full_stop():
    assert split_document("A Heading\n\n  \nThe body. Of it.") == ["A Heading", "The body.", "Of it."]
    assert split_document("   \n\n") == []


def test_document_lines_counts_sentences_per_document():
    lines, counts = document_lines(["One. Two.", "", "Three"], split=True)
    assert lines == "One.\nTwo.\nThree\n"
    assert counts.tolist() == [2, 0, 1] and counts.dtype == np.int64


def test_without_splitting_a_document_is_one_line():
    lines, counts = document_lines(["One. Two.", "wrapped\nline"], split=False)
    assert lines == "One. Two.\nwrapped line\n"
    assert counts.tolist() == [1, 1]
    assert document_lines([], split=True)[0] == ""

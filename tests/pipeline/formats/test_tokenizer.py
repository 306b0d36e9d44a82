"""Word tokenizers (pipeline/formats/tokenizer.py): what each makes of a line, and the invariant the
block format needs (non-empty tokens without whitespace)."""

from __future__ import annotations

import pytest

from pipeline.formats.tokenizer import TOKENIZERS, make_tokenizer


def test_moses_tokenizer_splits_punctuation_without_escaping():
    tokenize = make_tokenizer("moses")
    assert tokenize('And God said, "Let there be light": it\'s & <b>.') == [
        "And",
        "God",
        "said",
        ",",
        '"',
        "Let",
        "there",
        "be",
        "light",
        '"',
        ":",
        "it",
        "'s",
        "&",
        "<",
        "b",
        ">",
        ".",
    ]
    assert tokenize("  \t ") == []
    assert make_tokenizer("moses", lowercase=True)("The U.S.A. Army") == ["the", "u.s.a.", "army"]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_tokens_are_never_empty_nor_hold_whitespace(name):
    tokenize = make_tokenizer(name)
    line = "a\u00a0b \u2003 c\td\u3000e  , f\u200bg"  # no-break, em and ideographic spaces, a tab
    tokens = tokenize(line)
    assert tokens and all(t and not any(ch.isspace() for ch in t) for t in tokens), tokens
    assert "".join(tokens).replace(",", "") == "abcdef\u200bg"  # nothing but the spaces is lost


def test_whitespace_splits_on_any_unicode_space_and_lowercases_on_request():
    assert make_tokenizer("whitespace")("The  cat\u00a0sat .") == ["The", "cat", "sat", "."]
    assert make_tokenizer("whitespace", lowercase=True)("The CAT") == ["the", "cat"]


def test_an_unknown_tokenizer_is_named_with_the_choices():
    with pytest.raises(ValueError, match="unknown tokenizer 'spacy'; choose one of whitespace, moses"):
        make_tokenizer("spacy")

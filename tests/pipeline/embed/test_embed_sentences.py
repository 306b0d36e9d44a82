"""pipeline.embed.sentences: decoding, stripping, empty / invalid / long lines."""

from __future__ import annotations

import pytest

from pipeline.embed.errors import EmbedError
from pipeline.embed.sentences import prepare_lines, split_tokens


def _prepare(lines, **kw):
    args = {"max_tokens": 4, "long_sentences": "split", "invalid_utf8": "replace", "where": "in.txt"}
    return prepare_lines(lines, 10, **{**args, **kw})


def test_strip_split_and_counts():
    out = _prepare([b"  The cat\tsat \r", b"", b"   ", "caf\u00e9 ok".encode()])
    assert out.texts == ["The cat\tsat", "", "", "caf\u00e9 ok"]
    assert out.pieces == [[["The", "cat", "sat"]], [], [], [["caf\u00e9", "ok"]]]
    assert (out.empty_sentences, out.invalid_utf8_lines, out.split_sentences) == (2, 0, 0)
    assert out.num_lines == 4 and out.num_tokens == 5


def test_invalid_utf8_replaced_and_counted():
    out = _prepare([b"ok \xff\xfe bad", b"fine"])
    assert out.texts[0] == "ok \ufffd\ufffd bad"
    assert out.invalid_utf8_lines == 1


def test_invalid_utf8_error_names_line():
    with pytest.raises(EmbedError, match=r"in.txt: line 11 is not valid UTF-8"):
        _prepare([b"fine", b"\xc3("], invalid_utf8="error")


def test_long_line_split_into_pieces_and_counted():
    out = _prepare([b"a b c d e f g h i j"])
    assert out.pieces[0] == [["a", "b", "c", "d"], ["e", "f", "g", "h"], ["i", "j"]]
    assert out.split_sentences == 1 and out.num_tokens == 10


def test_long_line_refused_when_configured():
    with pytest.raises(EmbedError, match=r"line 10 has 5 tokens, more than max_sentence_tokens=4"):
        _prepare([b"a b c d e"], long_sentences="error")


def test_split_tokens_exact_multiple():
    assert split_tokens(["a", "b", "c", "d"], 2) == [["a", "b"], ["c", "d"]]
    assert split_tokens([], 2) == []

"""pipeline.embed.sentences: decoding, stripping, empty / invalid / control-character / long lines."""

from __future__ import annotations

import pytest

from pipeline.embed.errors import EmbedError
from pipeline.embed.sentences import prepare_lines, split_tokens
from pipeline.formats.tokenizer import make_tokenizer
from pipeline.shard.sentences import tokenize_lines
from pipeline.shard.split import heldout_threshold


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


def test_control_characters_are_spaces_and_counted_as_in_the_shard_stage():
    raw = [b"a\x00b", b"bell\x07 \x1b", b"\x00\x7f", b"tab\there\r", b"x\xc2\x85y", b"ok \xff\x01z"]
    out = _prepare(raw)
    assert out.pieces == [
        [["a", "b"]],
        [["bell"]],
        [],
        [["tab", "here"]],
        [["x", "y"]],
        [["ok", "\ufffd", "z"]],
    ]
    assert (out.control_char_lines, out.empty_sentences, out.invalid_utf8_lines) == (5, 1, 1)
    # the key of sentence_to_index stays the line as written (stripped)
    assert out.texts[:2] == ["a\x00b", "bell\x07 \x1b"]
    # the same tokens as the shard stage makes of these lines
    shard = tokenize_lines(b"\n".join(raw), make_tokenizer("whitespace"), 0, heldout_threshold(0.0))
    assert shard.tokens("train") == [p[0] for p in out.pieces if p]
    assert shard.stats.control_chars == out.control_char_lines


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

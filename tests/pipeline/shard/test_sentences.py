from collections import Counter

import numpy as np

from pipeline.formats.control_chars import CONTROL_CHARS
from pipeline.formats.tokenizer import make_tokenizer
from pipeline.shard.sentences import LineStats, tokenize_lines
from pipeline.shard.split import heldout_threshold


def _run(data: bytes, tokenizer="whitespace", max_line_bytes=50, fraction=0.0, **kwargs):
    return tokenize_lines(
        data, make_tokenizer(tokenizer), max_line_bytes, heldout_threshold(fraction), **kwargs
    )


def test_every_line_is_accounted_for():
    data = (
        b"the  cat\tsat \r\n"  # CRLF and odd whitespace: normalised
        b"\n"  # empty
        b"   \t \n"  # whitespace only: empty
        b"caf\xc3\xa9 ok\n"
        b"bad \xff\xfe bytes\n" + b"x " * 40 + b"\n"  # invalid UTF-8: replaced, kept  # 80 bytes: overlong
        b"last line without newline"
    )
    out = _run(data)
    assert out.tokens("train") == [
        ["the", "cat", "sat"],
        ["café", "ok"],
        ["bad", "\ufffd\ufffd", "bytes"],
        ["last", "line", "without", "newline"],
    ]
    assert out.tokens("heldout") == [] and out.heldout.lines() == []
    s = out.stats
    assert (s.lines, s.empty, s.overlong, s.invalid_utf8) == (7, 2, 1, 1)
    assert s.lines == s.train_sentences + s.heldout_sentences + s.empty + s.overlong
    assert s.train_tokens == 12 and s.max_sentence_tokens == 4


def test_control_characters_are_spaces_and_counted():
    data = b"".join(
        [
            b"a\x00b c\n",  # NUL between two words: two tokens, not one "a\x00b"
            b"bell\x07 ring\x1bend\n",  # BEL; ESC (as in a terminal colour code)
            b"\x00\x01\x7f\n",  # nothing but control characters: empty
            b"x\xc2\x85y\xc2\x9fz\n",  # C1 controls (U+0085, U+009F), UTF-8 encoded
            b"tab\tand cr\r\n",  # tab and CR are plain whitespace: not counted
            b"caf\xe9\x0c ok\n",  # invalid UTF-8 and a form feed: counted in both
            b"\x00" * 60 + b"\n",  # overlong (limit 50): dropped, counted as overlong only
            b"plain line",
        ]
    )
    out = _run(data)
    assert out.tokens("train") == [
        ["a", "b", "c"],
        ["bell", "ring", "end"],
        ["x", "y", "z"],
        ["tab", "and", "cr"],
        ["caf\ufffd", "ok"],
        ["plain", "line"],
    ]
    s = out.stats
    assert (s.lines, s.empty, s.overlong, s.invalid_utf8, s.control_chars) == (8, 1, 1, 1, 5)
    assert s.lines == s.train_sentences + s.heldout_sentences + s.empty + s.overlong
    assert not any(CONTROL_CHARS.search(token) for token in out.vocab)
    moses = _run(b"said\x00so, \x07then\n", "moses")
    assert moses.tokens("train") == [["said", "so", ",", "then"]] and moses.stats.control_chars == 1


def test_reader_dropped_lines_and_explicit_heldout():
    out = _run(b"a b\nc\n", dropped_overlong=2, all_heldout=True)
    assert out.tokens("train") == [] and out.tokens("heldout") == [["a", "b"], ["c"]]
    assert (out.stats.lines, out.stats.overlong, out.stats.heldout_tokens) == (4, 2, 3)


def test_compact_form_holds_lines_local_ids_and_lengths():
    data = "  the cat\tsat\nthe dog\n\ncafé the cat\n".encode()
    out = _run(data, fraction=0.5)
    both = out.tokens("train") + out.tokens("heldout")
    assert sorted(both) == sorted([["the", "cat", "sat"], ["the", "dog"], ["café", "the", "cat"]])
    assert out.tokens("train") and out.tokens("heldout")  # this data puts sentences in both
    # the local vocabulary: distinct tokens by first occurrence, training split first
    assert out.vocab == list(dict.fromkeys(tok for t in both for tok in t))
    for split in ("train", "heldout"):
        part = out.split(split)
        tokens = out.tokens(split)
        assert part.text == "\n".join(" ".join(t) for t in tokens).encode()
        assert part.ids.dtype == np.int32 and part.lengths.dtype == np.int32
        assert part.lengths.tolist() == [len(t) for t in tokens]
        assert [out.vocab[i] for i in part.ids] == [tok for t in tokens for tok in t]
    tokens, counts = out.train_counts()
    expected = Counter(tok for t in out.tokens("train") for tok in t)
    assert dict(zip(tokens, counts.tolist(), strict=True)) == dict(expected)
    assert out.nbytes == sum(
        len(p.text) + 4 * (len(p.ids) + len(p.lengths)) for p in (out.train, out.heldout)
    )


def test_stats_add_up():
    a, b = (
        LineStats(lines=3, empty=1, max_sentence_tokens=4),
        LineStats(lines=2, overlong=1, max_sentence_tokens=9),
    )
    a.add(b)
    assert (a.lines, a.empty, a.overlong, a.max_sentence_tokens) == (5, 1, 1, 9)


def test_a_reserved_word_is_refused_naming_its_line():
    import pytest

    from pipeline.shard.errors import ReservedWordError

    for word in ("<S>", "</S>", "<UNK>", "<s>", "</s>", "<unk>"):
        with pytest.raises(ReservedWordError) as err:
            _run(b"a fine line\nthe word " + word.encode() + b" is here\nmore", fraction=0.5)
        assert err.value.word == word and err.value.line == f"the word {word} is here"
    # a word that only looks like one is an ordinary word
    assert _run(b"<S2> and <unknown> and S\n").tokens("train") == [["<S2>", "and", "<unknown>", "and", "S"]]

"""Byte-level char ids (docs/encoding.md)."""

from __future__ import annotations

import pytest
import torch

from elmo_model import batch_to_ids, token_mask, token_to_ids

BOS = [259, 257, 260] + [261] * 47
EOS = [259, 258, 260] + [261] * 47


def test_batch_adds_boundaries_shift_and_padding():
    ids = batch_to_ids([["Hi", "é"], []])
    assert ids.shape == (2, 4, 50) and ids.dtype == torch.int64
    assert ids[0, 0].tolist() == BOS and ids[0, 3].tolist() == EOS
    assert ids[0, 1].tolist() == [259, ord("H") + 1, ord("i") + 1, 260] + [261] * 46
    assert ids[0, 2, :4].tolist() == [259, 0xC3 + 1, 0xA9 + 1, 260]  # UTF-8 bytes, not code points
    # The empty sentence is <S> </S> followed by all-zero padding positions.
    assert ids[1, 0].tolist() == BOS and ids[1, 1].tolist() == EOS
    assert ids[1, 2:].abs().sum() == 0
    assert token_mask(ids).tolist() == [[True] * 4, [True, True, False, False]]


def test_literal_boundary_strings_are_boundary_patterns():
    assert token_to_ids("<S>").tolist() == BOS
    assert token_to_ids("</S>").tolist() == EOS
    assert token_to_ids("<s>").tolist()[:6] == [259, ord("<") + 1, ord("s") + 1, ord(">") + 1, 260, 261]


def test_truncation_is_in_bytes():
    long = token_to_ids("x" * 10_000)
    assert long.tolist() == [259] + [ord("x") + 1] * 48 + [260]
    # 25 two-byte characters = 50 bytes: cut after 48 bytes (24 characters), no in-token padding left.
    accents = token_to_ids("é" * 25).tolist()
    assert accents[1:49] == [0xC3 + 1, 0xA9 + 1] * 24 and accents[49] == 260
    # 17 three-byte characters = 51 bytes: the 17th character is cut in half.
    cut = token_to_ids("€" * 17).tolist()
    assert cut[46:49] == [0xE2 + 1, 0x82 + 1, 0xAC + 1] and cut[49] == 260
    assert token_to_ids("").tolist() == [259, 260] + [261] * 48


def test_lone_surrogates_are_dropped():
    assert token_to_ids("a\udcffb").tolist() == token_to_ids("ab").tolist()
    assert token_to_ids("\ud800").tolist() == token_to_ids("").tolist()


def test_empty_batch_and_bad_inputs():
    assert batch_to_ids([]).shape == (0, 2, 50)
    with pytest.raises(TypeError, match="sentence 1 token 0 must be str"):
        batch_to_ids([["ok"], [3]])
    with pytest.raises(TypeError, match="sentence 0 must be a list"):
        batch_to_ids(["not tokenized"])
    with pytest.raises(TypeError, match="list of token lists"):
        batch_to_ids("text")
    with pytest.raises(TypeError, match="token must be str"):
        token_to_ids(b"bytes")

"""Byte-level character ids for ELMo (docs/encoding.md).

Every token becomes 50 ids. Raw ids are UTF-8 bytes (0..255) plus five markers (256..260); the
inference form used everywhere in this package shifts every raw id by +1 so that 0 can mean
"this whole token position is padding".
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

# The encoding is numpy's; torch is imported by the two functions that return tensors, so
# static_batches (and through it the embed stage's writer processes) loads no torch.
if TYPE_CHECKING:
    import torch

MAX_CHARACTERS_PER_TOKEN = 50
"""L: ids per token."""
MAX_TOKEN_BYTES = MAX_CHARACTERS_PER_TOKEN - 2
"""Bytes kept per token; the other two slots hold the begin/end-of-word markers."""

# Raw ids (before the +1 shift).
BEGIN_SENTENCE_CHAR = 256
END_SENTENCE_CHAR = 257
BEGIN_WORD_CHAR = 258
END_WORD_CHAR = 259
PADDING_CHAR = 260
N_RAW_CHARACTERS = 261
"""Rows of the trained char table (the file's `char_embed`)."""
N_CHARACTERS = N_RAW_CHARACTERS + 1
"""Rows of the inference char table: the trained rows plus the all-padding row 0."""

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


def _marker_pattern(char: int) -> np.ndarray:
    raw = np.full(MAX_CHARACTERS_PER_TOKEN, PADDING_CHAR, dtype=np.int64)
    raw[:3] = (BEGIN_WORD_CHAR, char, END_WORD_CHAR)
    return raw + 1


_SPECIAL_TOKENS = {
    BOS_TOKEN: _marker_pattern(BEGIN_SENTENCE_CHAR),
    EOS_TOKEN: _marker_pattern(END_SENTENCE_CHAR),
}


@lru_cache(maxsize=1 << 17)
def _encode_cached(token: str) -> np.ndarray:
    special = _SPECIAL_TOKENS.get(token)
    if special is not None:
        return special
    # errors="ignore" drops lone surrogates (strings decoded with surrogateescape etc.), as both
    # references do; the truncation is in bytes, so a multi-byte character may be cut in half.
    data = token.encode("utf-8", errors="ignore")[:MAX_TOKEN_BYTES]
    raw = np.full(MAX_CHARACTERS_PER_TOKEN, PADDING_CHAR, dtype=np.int64)
    raw[0] = BEGIN_WORD_CHAR
    raw[1 : len(data) + 1] = np.frombuffer(data, dtype=np.uint8)
    raw[len(data) + 1] = END_WORD_CHAR
    encoded = raw + 1
    encoded.setflags(write=False)
    return encoded


def token_to_ids(token: str) -> np.ndarray:
    """Encode one token as 50 +1-shifted ids (int64 array of shape (50,), read-only).

    `<S>` and `</S>` give the sentence-boundary patterns; any other string is its UTF-8 bytes
    (lone surrogates dropped, truncated to 48 bytes) between begin/end-of-word markers.
    """
    if not isinstance(token, str):
        raise TypeError(f"token must be str, got {type(token).__name__}: {token!r}")
    return _encode_cached(token)


def tokens_to_ids(tokens: Sequence[str]) -> torch.Tensor:
    """Encode a flat list of tokens (no boundaries added): LongTensor (len(tokens), 50)."""
    import torch

    out = np.zeros((len(tokens), MAX_CHARACTERS_PER_TOKEN), dtype=np.int64)
    for i, token in enumerate(tokens):
        out[i] = token_to_ids(token)
    return torch.from_numpy(out)


def _check_sentences(sentences: Sequence[Sequence[str]]) -> None:
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise TypeError(f"batch_to_ids expects a list of token lists, got {type(sentences).__name__}")
    for row, sentence in enumerate(sentences):
        if isinstance(sentence, str) or not isinstance(sentence, Sequence):
            raise TypeError(
                f"batch_to_ids: sentence {row} must be a list of str tokens, got {type(sentence).__name__}"
            )
        for col, token in enumerate(sentence):
            if not isinstance(token, str):
                raise TypeError(
                    f"batch_to_ids: sentence {row} token {col} must be str, got {type(token).__name__}"
                )


def batch_to_ids(sentences: Sequence[Sequence[str]]) -> torch.Tensor:
    """Encode tokenized sentences with `<S>`/`</S>` added: LongTensor (B, T+2, 50).

    T is the longest sentence's token count. Ids are +1-shifted; shorter rows are right-padded
    with all-zero token positions. An empty sentence becomes just `<S> </S>` (length 2), so every
    row has at least two real positions. An empty batch (B = 0) gives shape (0, 2, 50).
    """
    import torch

    _check_sentences(sentences)
    width = max((len(s) for s in sentences), default=0) + 2
    out = np.zeros((len(sentences), width, MAX_CHARACTERS_PER_TOKEN), dtype=np.int64)
    for row, sentence in enumerate(sentences):
        out[row, 0] = _SPECIAL_TOKENS[BOS_TOKEN]
        for col, token in enumerate(sentence, start=1):
            out[row, col] = _encode_cached(token)
        out[row, len(sentence) + 1] = _SPECIAL_TOKENS[EOS_TOKEN]
    return torch.from_numpy(out)


def token_mask(char_ids: torch.Tensor) -> torch.Tensor:
    """Real-token mask of char ids (..., T, 50) -> bool (..., T): a position is real iff any id > 0."""
    return (char_ids > 0).any(dim=-1)

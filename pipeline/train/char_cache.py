"""Per-vocabulary character arrays: every vocabulary word is spelled once, batches gather rows.

Training inputs are full character spellings while softmax targets are vocabulary ids (docs/encoding.md#the-word-vocabulary,
7.2). Spelling every token of every batch in Python would dominate the data path, so the
vocabulary's spellings are encoded once into a table and a batch is one numpy gather over its
word ids. Out-of-vocabulary tokens (id ``<UNK>``) keep their own spelling: the caller passes their
positions and words, and only those few are encoded per batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elmo_model.characters import MAX_CHARACTERS_PER_TOKEN, token_to_ids, tokens_to_ids

ENCODE_CHUNK = 65536
"""Vocabulary words encoded per call while building the table (bounds the int64 scratch array)."""


class CharCache:
    """The +1-shifted character ids (elmo_model.characters) of every word of a vocabulary.

    ``table``: int16 array ``(V, 50)``; row ``v`` spells vocabulary word ``v`` (the boundary tokens
    ``<S>``/``</S>`` get their marker patterns). Ids lie in 1..261, so 0 never occurs.
    """

    def __init__(self, tokens: Sequence[str]):
        if len(tokens) == 0:
            raise ValueError("CharCache: the vocabulary is empty")
        self.tokens = list(tokens)
        # int16 holds 0..261 and keeps the original 793k-word vocabulary at 79 MB instead of 317 MB.
        self.table = np.empty((len(self.tokens), MAX_CHARACTERS_PER_TOKEN), dtype=np.int16)
        for start in range(0, len(self.tokens), ENCODE_CHUNK):
            chunk = self.tokens[start : start + ENCODE_CHUNK]
            self.table[start : start + len(chunk)] = tokens_to_ids(chunk).numpy()

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def spell(
        self,
        ids: np.ndarray,
        oov_index: tuple[np.ndarray, ...] = (),
        oov_words: Sequence[str] = (),
    ) -> np.ndarray:
        """Character ids of word ids, with out-of-vocabulary positions spelled from their words.

        ``ids``: integer array of any shape ``S`` holding vocabulary ids (``0 <= id < V``).
        ``oov_index``: a numpy advanced index into ``ids`` (one integer array per dimension, each
        of length K) of positions whose real spelling is ``oov_words[k]`` (K strings).
        Returns int64 ``S + (50,)``, +1-shifted.
        """
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.tokens)):
            raise ValueError(
                f"CharCache.spell: word ids must lie in [0, {len(self.tokens)}), got {ids.min()}..{ids.max()}"
            )
        out = self.table[ids].astype(np.int64)
        if len(oov_words):
            if not oov_index or len(oov_index[0]) != len(oov_words):
                raise ValueError(
                    f"CharCache.spell: {len(oov_words)} OOV words but an index of another length"
                )
            out[oov_index] = np.stack([token_to_ids(word) for word in oov_words])
        return out

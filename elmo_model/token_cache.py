"""Precomputed token vectors for a vocabulary (docs/model.md#token-cache), with a char-CNN fallback for other words.

The vectors are a snapshot of the encoder's weights at construction: rebuild the cache after
changing them. Cached and fallback vectors come from the same `TokenEncoder.encode_unique`, so
outputs are the same whichever path a word takes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elmo_model.characters import BOS_TOKEN, EOS_TOKEN, tokens_to_ids
from elmo_model.token_encoder import TokenEncoder


class TokenCache:
    """Token vectors (V, P) for `vocabulary` (+ `<S>`, `</S>`), computed `chunk_size` words at a time."""

    def __init__(self, encoder: TokenEncoder, vocabulary: Sequence[str], chunk_size: int = 4096):
        words = list(dict.fromkeys([BOS_TOKEN, EOS_TOKEN, *vocabulary]))
        self.encoder = encoder
        self.index = {word: i for i, word in enumerate(words)}
        device = next(encoder.parameters()).device
        with torch.no_grad():
            chunks = [
                encoder.encode_unique(tokens_to_ids(words[i : i + chunk_size]).to(device))
                for i in range(0, len(words), chunk_size)
            ]
        self.vectors = torch.cat(chunks)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def embed(self, sentences: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sentences -> token vectors (B, T+2, P) with `<S>`/`</S>` added, zeros at padding, and mask (B, T+2).

        Words outside the vocabulary go through the char CNN (each distinct one once).
        Feed the result to `BiLM.forward_embeddings`.
        """
        rows = [[BOS_TOKEN, *sentence, EOS_TOKEN] for sentence in sentences]
        steps = max((len(r) for r in rows), default=2)
        oov = list(dict.fromkeys(w for r in rows for w in r if w not in self.index))
        table = self.vectors
        if oov:
            with torch.no_grad():
                fallback = self.encoder.encode_unique(tokens_to_ids(oov).to(table.device))
            table = torch.cat([table, fallback])
        lookup = {**self.index, **{w: len(self.index) + i for i, w in enumerate(oov)}}
        ids = torch.full((len(rows), steps), -1, dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor([lookup[w] for w in row])
        ids = ids.to(table.device)
        mask = ids >= 0
        tokens = table[ids.clamp(min=0)] * mask.unsqueeze(-1).to(table.dtype)
        return tokens, mask

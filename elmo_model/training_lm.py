"""A BiLM's training forward over padding-free windows of both streams (docs/training.md#network-in-training).

Training batches hold B rows x U tokens of two streams, every position real, and running text
repeats tokens: the token encoder runs once per distinct spelling of the batch (``chars``), and
each position gathers its vector (``positions``). The caller finds the distinct spellings on the
host, so the forward has static shapes and no host synchronisation (a CUDA graph can capture it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from elmo_model.bilm import BiLM
from elmo_model.lstm import LSTMState


class TrainingLM(nn.Module):
    """``bilm`` with dropout ``dropout`` on every LSTM layer's input and on the top output."""

    def __init__(self, bilm: BiLM, dropout: float):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.bilm = bilm
        self.dropout = dropout

    def forward(
        self, chars: torch.Tensor, positions: torch.Tensor, c: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A training window, differentiable.

        chars (K, 50) the distinct token spellings (+1-shifted ids; extra all-zero rows allowed),
        positions (2, B, U) long the row of ``chars`` at each position of the forward [0] and
        reversed [1] stream, c (N, 2, B, C) / h (N, 2, B, P) the carried state ->
        top (2, B, U, P) (dropout applied in training), and the new c, h.
        """
        vectors = self.bilm.token_encoder.encode_unique(chars)  # (K, P)
        # index_select's gradient is an index_add: no host synchronisation, unlike some embedding paths
        tokens = vectors.index_select(0, positions.reshape(-1)).view(*positions.shape, -1)
        dropout = self.dropout if self.training else 0.0
        top, final = self.bilm.lstm.forward_window(tokens, LSTMState(c, h), dropout)
        return F.dropout(top, dropout, training=dropout > 0), final.c, final.h

    @torch.no_grad()
    def score_window(
        self, char_ids: torch.Tensor, c: torch.Tensor | None, h: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The evaluation path (no gradient, no dropout): char_ids (2, B, U, 50) of both streams,
        c, h the carried state (None = zeros) -> top (2, B, U, P) and the new c, h."""
        _, batch, steps, chars = char_ids.shape
        tokens = self.bilm.token_encoder(char_ids.reshape(2 * batch, steps, chars)).view(2, batch, steps, -1)
        mask = torch.ones(batch, steps, dtype=torch.bool, device=char_ids.device)
        state = LSTMState(c, h) if c is not None else None
        outs, final = self.bilm.lstm(tokens, mask, state)
        return outs[-1], final.c, final.h

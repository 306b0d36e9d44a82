"""Context-independent token representations: char embedding -> CNN -> highway -> projection (spec 4.1-4.4).

Only real token positions are encoded, and each distinct token of a batch only once: the 50-id
rows are deduplicated, encoded, and gathered back. Padding positions get zero vectors.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from elmo_model.characters import MAX_CHARACTERS_PER_TOKEN, N_CHARACTERS, token_mask
from elmo_model.options import BiLMOptions


class Highway(nn.Module):
    """One highway layer in bilm-tf's convention (spec 4.3), as one fused Linear(F, 2F).

    `linear` output = [transform | carry]: g = sigmoid(carry), h = relu(transform),
    y = g * h + (1 - g) * x. The file's `W_carry` is the gate that multiplies the relu branch.
    """

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.linear = nn.Linear(width, 2 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., F) -> (..., F)."""
        transform, carry = self.linear(x).split(self.width, dim=-1)
        gate = torch.sigmoid(carry)
        return gate * F.relu(transform) + (1.0 - gate) * x


class TokenEncoder(nn.Module):
    """Char ids (..., 50) -> token vectors (..., P). Row 0 of the char table is the fixed zero padding row."""

    def __init__(self, options: BiLMOptions):
        super().__init__()
        self.options = options
        self.char_embedding = nn.Embedding(N_CHARACTERS, options.char_embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(
            nn.Conv1d(options.char_embed_dim, count, width) for width, count in options.filters
        )
        self.highways = nn.ModuleList(Highway(options.n_filters) for _ in range(options.n_highway))
        self.projection = (
            nn.Linear(options.n_filters, options.projection_dim)
            if options.n_filters != options.projection_dim
            else None
        )
        self.activation = torch.tanh if options.activation == "tanh" else F.relu

    @property
    def output_dim(self) -> int:
        return self.options.projection_dim

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation (spec 7.10)."""
        opts = self.options
        with torch.no_grad():
            nn.init.uniform_(self.char_embedding.weight, -1.0, 1.0)
            self.char_embedding.weight[0].zero_()
            for conv, (width, _) in zip(self.convs, opts.filters, strict=True):
                if opts.activation == "relu":
                    nn.init.uniform_(conv.weight, -0.05, 0.05)
                else:
                    nn.init.normal_(conv.weight, 0.0, math.sqrt(1.0 / (width * opts.char_embed_dim)))
                nn.init.zeros_(conv.bias)
            std = math.sqrt(1.0 / opts.n_filters)
            for highway in self.highways:
                nn.init.normal_(highway.linear.weight, 0.0, std)
                transform_bias, carry_bias = highway.linear.bias.split(opts.n_filters)
                transform_bias.zero_()
                carry_bias.fill_(-2.0)
            if self.projection is not None:
                nn.init.normal_(self.projection.weight, 0.0, std)
                nn.init.zeros_(self.projection.bias)

    def encode_unique(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Encode a flat set of real tokens: (U, 50) ids, all rows non-padding -> (U, P)."""
        # (U, 50, d_c) -> (U, d_c, 50): Conv1d wants channels first.
        chars = self.char_embedding(char_ids).transpose(1, 2)
        pooled = [self.activation(conv(chars).amax(dim=-1)) for conv in self.convs]
        x = torch.cat(pooled, dim=-1)
        for highway in self.highways:
            x = highway(x)
        if self.projection is not None:
            x = self.projection(x)
        return x

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """char ids (..., T, 50), +1-shifted, 0 = padding -> (..., T, P), zeros at padding positions."""
        if char_ids.shape[-1] != MAX_CHARACTERS_PER_TOKEN:
            raise ValueError(f"char ids must have last dimension 50, got shape {tuple(char_ids.shape)}")
        if char_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"char ids must be an integer tensor, got {char_ids.dtype}")
        if char_ids.numel() and (int(char_ids.min()) < 0 or int(char_ids.max()) >= N_CHARACTERS):
            raise ValueError(
                f"char ids must lie in [0, {N_CHARACTERS - 1}] (+1-shifted form), "
                f"got range [{int(char_ids.min())}, {int(char_ids.max())}]"
            )
        lead = char_ids.shape[:-1]
        flat = char_ids.reshape(-1, MAX_CHARACTERS_PER_TOKEN).long()
        positions = token_mask(flat).nonzero().squeeze(1)
        unique, inverse = torch.unique(flat.index_select(0, positions), dim=0, return_inverse=True)
        encoded = self.encode_unique(unique)
        out = encoded.new_zeros(flat.shape[0], encoded.shape[-1])
        out = out.index_copy(0, positions, encoded.index_select(0, inverse))
        return out.view(*lead, encoded.shape[-1])

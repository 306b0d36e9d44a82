"""Context-independent token representations: char embedding -> CNN -> highway -> projection (docs/model.md#token-encoder).

Only real token positions are encoded, and each distinct token of a batch only once: the 50-id
rows are deduplicated, encoded, and gathered back. Padding positions get zero vectors.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from elmo_model.characters import MAX_CHARACTERS_PER_TOKEN, N_CHARACTERS, token_mask
from elmo_model.distinct_rows import distinct_rows
from elmo_model.options import BiLMOptions


class Highway(nn.Module):
    """One highway layer in bilm-tf's convention (docs/model.md#token-encoder), as one fused Linear(F, 2F).

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
        """bilm-tf's initialisation (docs/training.md#initialisation)."""
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

    CONV_CHUNK = 32
    """Tokens per matrix product in `max_pooled_convolutions`: (32, 50, 2048) floats stay in cache."""

    def max_pooled_convolutions(self, chars: torch.Tensor) -> torch.Tensor:
        """Char vectors (U, 50, d_c) -> every filter's maximum over its valid windows, bias added (U, F).

        All widths run as one matrix product over the 50 windows of the widest width W (chars
        zero-padded at the end): a width-w filter's weights fill the first w * d_c rows of its
        columns and zeros the rest, and only its 51 - w windows that lie inside the token are pooled,
        so the result is the per-width convolutions' (to rounding). On 2 CPU threads this is about
        2.5x faster than seven Conv1d calls. The bias is added after the maximum: rounding is monotone,
        so max(x + b) = max(x) + b exactly.
        """
        n_tokens, n_chars, d_c = chars.shape
        widest = max(width for width, _ in self.options.filters)
        blocks = [
            F.pad(
                conv.weight.permute(2, 1, 0).reshape(-1, conv.out_channels), (0, 0, 0, (widest - width) * d_c)
            )
            for conv, (width, _) in zip(self.convs, self.options.filters, strict=True)
        ]
        weight = torch.cat(blocks, dim=1)  # (W * d_c, F), row j * d_c + channel
        windows = F.pad(chars, (0, 0, 0, widest - 1)).unfold(1, widest, 1)  # (U, 50, d_c, W)
        windows = windows.transpose(2, 3).reshape(n_tokens, n_chars, widest * d_c)
        # Chunks keep a CPU's caches warm; a GPU wants one large product instead of many launches.
        step = self.CONV_CHUNK if chars.device.type == "cpu" else max(n_tokens, 1)
        pooled = []
        for start in range(0, max(n_tokens, 1), step):
            chunk = windows[start : start + step]
            y = torch.mm(chunk.reshape(-1, widest * d_c), weight).view(
                chunk.shape[0], n_chars, weight.shape[1]
            )
            columns = torch.split(y, [count for _, count in self.options.filters], dim=-1)
            pooled.append(
                torch.cat(
                    [
                        block[:, : n_chars - width + 1].amax(dim=1)
                        for block, (width, _) in zip(columns, self.options.filters, strict=True)
                    ],
                    dim=-1,
                )
            )
        return torch.cat(pooled) + torch.cat([conv.bias for conv in self.convs])

    def encode_unique(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Encode a flat set of real tokens: (U, 50) ids, all rows non-padding -> (U, P)."""
        x = self.activation(self.max_pooled_convolutions(self.char_embedding(char_ids)))
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
        unique, inverse = distinct_rows(flat.index_select(0, positions))
        encoded = self.encode_unique(unique)
        out = encoded.new_zeros(flat.shape[0], encoded.shape[-1])
        out = out.index_copy(0, positions, encoded.index_select(0, inverse))
        return out.view(*lead, encoded.shape[-1])

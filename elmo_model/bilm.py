"""The ELMo biLM: token encoder + fused bidirectional LSTM stack, optional per-row state (docs/model.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from elmo_model.characters import token_mask
from elmo_model.lstm import LSTMState, StackedBiLSTM
from elmo_model.options import BiLMOptions
from elmo_model.token_encoder import TokenEncoder


@dataclass
class BiLMOutput:
    """layers (B, N+1, T, 2P): layer 0 = [tok | tok], layer l = [forward_l | backward_l], boundaries kept,
    zeros at padding; mask (B, T) bool, True at real positions (boundaries included)."""

    layers: torch.Tensor
    mask: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) real positions per row, boundaries included."""
        return self.mask.sum(dim=1)


def reverse_index(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """(B,) lengths -> (B, T) gather index reversing each row within its length (padding stays put)."""
    t = torch.arange(steps, device=lengths.device).unsqueeze(0)
    n = lengths.unsqueeze(1)
    return torch.where(t < n, n - 1 - t, t)


def reverse_within_lengths(x: torch.Tensor, index: torch.Tensor, time_dim: int) -> torch.Tensor:
    """Apply a `reverse_index` (B, T) to x whose dims `time_dim - 1` and `time_dim` are (B, T)."""
    shape = [1] * x.dim()
    shape[time_dim - 1], shape[time_dim] = index.shape
    return x.gather(time_dim, index.view(shape).expand_as(x))


class BiLM(nn.Module):
    """Char ids (B, T, 50) with boundaries -> `BiLMOutput`.

    Stateless by default: every call starts from zero states, so a sentence's vectors do not depend
    on its batch mates or on earlier calls. With `stateful = True` the final state of row k is kept
    and used as the initial state of row k in the next call (bilm-tf/AllenNLP behaviour, docs/model.md#statefulness);
    rows beyond a call's batch size and rows with no real positions are left untouched.
    """

    def __init__(self, options: BiLMOptions | dict, max_batch_size: int = 0):
        super().__init__()
        self.bilm_options = options if isinstance(options, BiLMOptions) else BiLMOptions.from_dict(options)
        opts = self.bilm_options
        self.token_encoder = TokenEncoder(opts)
        self.lstm = StackedBiLSTM(
            n_layers=opts.n_layers,
            input_dim=opts.projection_dim,
            dim=opts.dim,
            projection_dim=opts.projection_dim,
            cell_clip=opts.cell_clip,
            proj_clip=opts.proj_clip,
            use_skip_connections=opts.use_skip_connections,
            dropout=opts.dropout,
        )
        self.stateful = False
        self.max_batch_size = max_batch_size
        self._state: LSTMState | None = None

    # ---- construction / IO -------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: BiLMOptions | dict, max_batch_size: int = 0) -> BiLM:
        """Randomly initialised model with bilm-tf's initialisation (docs/training.md#initialisation), train mode, trainable."""
        model = cls(options, max_batch_size=max_batch_size)
        model.reset_parameters()
        return model.train()

    @classmethod
    def from_files(cls, options_file: str | Path, weight_file, max_batch_size: int = 0) -> BiLM:
        """Load options.json + bilm-tf HDF5 weights: eval mode, float32, stateless. The file's
        datasets are checked against the options (names, shapes, dtypes, values) before the model
        is built, so options that disagree with their weights allocate nothing."""
        from elmo_model.weights import copy_arrays, read_arrays

        options = BiLMOptions.from_file(options_file)
        arrays = read_arrays(weight_file, options)
        model = cls(options, max_batch_size=max_batch_size)
        copy_arrays(model, arrays)
        return model.eval()

    def save_files(self, options_file: str | Path, weight_file) -> None:
        """Export in bilm-tf's format (docs/weights.md#export): inference options.json and HDF5 weights."""
        from elmo_model.weights import save_weights

        Path(options_file).write_text(json.dumps(self.options, indent=2) + "\n", encoding="utf-8")
        save_weights(self, weight_file)

    @property
    def options(self) -> dict:
        """The options in options.json inference form (`n_characters` 262, every key present)."""
        return self.bilm_options.to_dict()

    @property
    def num_layers(self) -> int:
        """N + 1 output layers."""
        return self.bilm_options.n_layers + 1

    @property
    def output_dim(self) -> int:
        """2P: width of every output layer."""
        return 2 * self.bilm_options.projection_dim

    def reset_parameters(self) -> None:
        self.token_encoder.reset_parameters()
        for layer in self.lstm.layers:
            layer.reset_parameters()

    # ---- state -------------------------------------------------------------------------------
    @property
    def state(self) -> LSTMState | None:
        """The stored per-row state, c (N, 2, R, C) / h (N, 2, R, P), or None before the first stateful call."""
        return self._state

    def reset_states(self, rows: torch.Tensor | None = None) -> None:
        """Zero the stored state of all rows, or of `rows` (bool mask over stored rows, or row indices)."""
        if rows is None or self._state is None:
            self._state = None
            return
        for tensor in (self._state.c, self._state.h):
            tensor[:, :, rows.to(tensor.device)] = 0.0

    def _read_state(self, batch: int) -> LSTMState:
        """Rows 0..batch-1 of the store (a view), growing it with zero rows first if needed."""
        stored = self._state
        like = self.lstm.layers[0].w_hh
        if stored is None:
            stored = self.lstm.zero_state(max(batch, self.max_batch_size))
        elif stored.c.shape[2] < batch:
            extra = self.lstm.zero_state(batch - stored.c.shape[2])
            stored = LSTMState(torch.cat([stored.c, extra.c], 2), torch.cat([stored.h, extra.h], 2))
        if stored.c.device != like.device or stored.c.dtype != like.dtype:  # the model was moved
            stored = LSTMState(stored.c.to(like), stored.h.to(like))
        if stored.c.is_inference() and not torch.is_inference_mode_enabled():
            # Made under inference_mode, so read-only outside it: continue with an ordinary copy.
            stored = LSTMState(stored.c.clone(), stored.h.clone())
        self._state = stored
        return LSTMState(stored.c[:, :, :batch], stored.h[:, :, :batch])

    def _write_state(self, final: LSTMState) -> None:
        batch = final.c.shape[2]
        with torch.no_grad():
            self._state.c[:, :, :batch] = final.c.detach()
            self._state.h[:, :, :batch] = final.h.detach()

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, char_ids: torch.Tensor) -> BiLMOutput:
        """char ids (B, T, 50), +1-shifted, boundaries included, 0 = padding -> BiLMOutput."""
        if char_ids.dim() != 3:
            raise ValueError(f"BiLM expects char ids of shape (B, T, 50), got {tuple(char_ids.shape)}")
        mask = token_mask(char_ids)
        return self.forward_embeddings(self.token_encoder(char_ids), mask)

    def forward_embeddings(self, tokens: torch.Tensor, mask: torch.Tensor) -> BiLMOutput:
        """Contextualise precomputed token vectors (B, T, P) with mask (B, T) (the token-cache path)."""
        mask = mask.bool()
        tokens = tokens * mask.unsqueeze(-1).to(tokens.dtype)
        batch, steps, _ = tokens.shape
        index = reverse_index(mask.sum(dim=1), steps)
        inputs = torch.stack([tokens, reverse_within_lengths(tokens, index, 1)])
        state = self._read_state(batch) if self.stateful else None
        outs, final = self.lstm(inputs, mask, state)
        if self.stateful:
            self._write_state(final)
        # Written into one (B, N+1, T, 2P) tensor: concatenating and transposing would copy each
        # layer's output three more times.
        p = tokens.shape[-1]
        layers = outs.new_empty(batch, outs.shape[0] + 1, steps, 2 * p)
        layers[:, 0, :, :p] = tokens
        layers[:, 0, :, p:] = tokens
        layers[:, 1:, :, :p] = outs[:, 0].transpose(0, 1)
        layers[:, 1:, :, p:] = reverse_within_lengths(outs[:, 1], index, 2).transpose(0, 1)
        return BiLMOutput(layers=layers, mask=mask)

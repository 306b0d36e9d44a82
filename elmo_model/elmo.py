"""AllenNLP-style Elmo module: one biLM pass, `num_output_representations` ScalarMix outputs (docs/model.md#layer-mixing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from elmo_model.bilm import BiLM
from elmo_model.scalar_mix import ScalarMix


def remove_sentence_boundaries(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop each row's `<S>` and `</S>`: tensor (B, T, D), mask (B, T) -> (B, T-2, D), mask (B, T-2).

    Positions 1..len-2 move to 0..len-3; the rest is zero (AllenNLP `remove_sentence_boundaries`).
    """
    lengths = mask.sum(dim=1)
    steps = tensor.shape[1] - 2
    new_mask = torch.arange(steps, device=mask.device).unsqueeze(0) < (lengths - 2).unsqueeze(1)
    return tensor[:, 1:-1] * new_mask.unsqueeze(-1).to(tensor.dtype), new_mask


class Elmo(nn.Module):
    """char ids (..., T, 50) with boundaries -> {'elmo_representations': k x (..., T', 2P), 'mask': (..., T')}.

    T' = T - 2 unless `keep_sentence_boundaries`. The biLM is frozen unless `requires_grad`.
    `scalar_mix_parameters` fixes the pre-softmax weights of every mix (not trainable).
    """

    def __init__(
        self,
        bilm: BiLM,
        num_output_representations: int,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
    ):
        super().__init__()
        if num_output_representations < 1:
            raise ValueError(
                f"Elmo: num_output_representations must be >= 1, got {num_output_representations}"
            )
        self.bilm = bilm
        for parameter in bilm.parameters():
            parameter.requires_grad_(requires_grad)
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.dropout = nn.Dropout(p=dropout)
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(
                bilm.num_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=scalar_mix_parameters is None,
            )
            for _ in range(num_output_representations)
        )

    @classmethod
    def from_files(
        cls, options_file: str | Path, weight_file, num_output_representations: int, **kwargs
    ) -> Elmo:
        return cls(BiLM.from_files(options_file, weight_file), num_output_representations, **kwargs)

    def forward(self, char_ids: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        if char_ids.dim() < 3:
            raise ValueError(f"Elmo expects char ids of shape (..., T, 50), got {tuple(char_ids.shape)}")
        lead = char_ids.shape[:-2]
        output = self.bilm(char_ids.reshape(-1, *char_ids.shape[-2:]))
        representations = []
        mask = output.mask
        for mix in self.scalar_mixes:
            mixed = mix(output.layers, output.mask)
            if self.keep_sentence_boundaries:
                mask = output.mask
            else:
                mixed, mask = remove_sentence_boundaries(mixed, output.mask)
            representations.append(self.dropout(mixed).view(*lead, *mixed.shape[1:]))
        return {"elmo_representations": representations, "mask": mask.view(*lead, mask.shape[-1])}

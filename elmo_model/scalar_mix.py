"""AllenNLP's ScalarMix: gamma * sum_j softmax(w)_j * layer_j, optional masked scalar layer norm (docs/model.md#layer-mixing)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def layer_norm_epsilon(dtype: torch.dtype) -> float:
    """AllenNLP's `tiny_value_of_dtype`: 1e-13 for float32/float64, 1e-4 for half precision."""
    return 1e-4 if dtype in (torch.float16, torch.bfloat16) else 1e-13


def masked_scalar_layer_norm(tensor: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with ONE mean/variance over all unmasked entries (docs/model.md#layer-mixing).

    tensor (B, T, D), mask (B, T) bool. Masked positions are normalised too (not zeroed).
    """
    weights = mask.unsqueeze(-1).to(tensor.dtype)
    count = weights.sum() * tensor.shape[-1]
    masked = tensor * weights
    mean = masked.sum() / count
    variance = (((masked - mean) * weights) ** 2).sum() / count
    return (tensor - mean) / torch.sqrt(variance + eps)


class ScalarMix(nn.Module):
    """Mix N layers: tensors N x (..., D) or one tensor (B, N, T, D) -> (..., D).

    Parameters `scalar_parameters.{j}` (pre-softmax weights, default 0) and `gamma` (default 1);
    with `trainable=False` they are fixed (AllenNLP's `scalar_mix_parameters`).
    """

    def __init__(
        self,
        mixture_size: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
    ):
        super().__init__()
        if mixture_size < 1:
            raise ValueError(f"ScalarMix: mixture_size must be >= 1, got {mixture_size}")
        initial = (
            list(initial_scalar_parameters) if initial_scalar_parameters is not None else [0.0] * mixture_size
        )
        if len(initial) != mixture_size:
            raise ValueError(
                f"ScalarMix: initial_scalar_parameters has {len(initial)} values, expected {mixture_size}"
            )
        self.mixture_size = mixture_size
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.ParameterList(
            nn.Parameter(torch.tensor([float(v)]), requires_grad=trainable) for v in initial
        )
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)

    def forward(
        self, tensors: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tensors: list of N (B, T, D) or a (B, N, T, D) tensor; mask (B, T) bool, needed for layer norm."""
        layers = list(tensors.unbind(1)) if isinstance(tensors, torch.Tensor) else list(tensors)
        if len(layers) != self.mixture_size:
            raise ValueError(f"ScalarMix: got {len(layers)} layers, expected {self.mixture_size}")
        weights = torch.softmax(torch.cat(list(self.scalar_parameters)), dim=0)
        if self.do_layer_norm:
            if mask is None:
                raise ValueError("ScalarMix: do_layer_norm=True needs a mask")
            eps = layer_norm_epsilon(layers[0].dtype)
            layers = [masked_scalar_layer_norm(t, mask.bool(), eps) for t in layers]
        mixed = sum(w * t for w, t in zip(weights.unbind(0), layers, strict=True))
        return self.gamma * mixed

"""The arithmetic of a forward pass, as a choice every caller names (embed, probe, benchmarks).

Torch-free, so that a stage's config (``pipeline/embed/config.py``, ``pipeline/probe/config.py``)
loads without torch and an entry point hears a signal before its heavy imports."""

from __future__ import annotations

import enum


class Precision(enum.Enum):
    """A forward's arithmetic: the one list of choices for every caller (embed, probe, benchmarks)."""

    float32 = "float32"
    """Exact: the original model's arithmetic (TF32 off on GPUs)."""
    tf32 = "tf32"
    """TF32 matrix products on CUDA GPUs (the same as float32 on a CPU)."""
    bf16 = "bf16"
    """bfloat16 matrix products, the cell state and the outputs' arithmetic in float32."""


PRECISIONS = tuple(p.value for p in Precision)

"""How large a forward pass is: its token budget and its rows (``batch_tokens``,
``max_batch_sentences``; 0 = chosen here).

On a CPU a pass of 4,096 positions keeps the caches warm and costs nothing in padding. On a GPU a
pass runs its T steps one after the other whatever its rows (measured on an H100: bf16 ran no
faster than tf32 at 8,192 tokens a pass, a pass bound by its sequential small kernels), so more
rows per pass is nearly free throughput: the budget is what the device's free memory holds, from
8,192 up to 131,072 positions (``MAX_GPU_TOKENS``), with as many rows as the shortest bucket needs.
The free memory is asked of the GPU an actor would get, once, by a task on it (one process start).
"""

from __future__ import annotations

from dataclasses import dataclass

from elmo_model.static_batches import DEFAULT_STEPS
from elmo_model.static_inference import OutputSpec, device_bytes_per_position

CPU_TOKENS = 4096
CPU_ROWS = 256
MIN_GPU_TOKENS = 8192
MAX_GPU_TOKENS = 131072
MEMORY_SHARE = 0.5
"""Of a GPU's free memory, what one pass's buffers may take: the CUDA graphs of every bucket shape
share one pool, which holds about one shape's peak, and the allocator's blocks round up."""


@dataclass(frozen=True)
class PassSize:
    tokens: int
    rows: int


def gpu_tokens(free_bytes: int, per_position: int) -> int:
    """The largest power of two of positions whose buffers fit ``MEMORY_SHARE`` of ``free_bytes``,
    within [MIN_GPU_TOKENS, MAX_GPU_TOKENS]."""
    fits = int(MEMORY_SHARE * free_bytes) // max(1, per_position)
    tokens = 1 << max(0, fits.bit_length() - 1)
    return max(MIN_GPU_TOKENS, min(MAX_GPU_TOKENS, tokens))


def pass_size(tokens: int, rows: int, device: str, free_bytes: int = 0, per_position: int = 1) -> PassSize:
    """The configured ``tokens`` / ``rows``, or (0) the defaults for ``device`` (``cpu`` or
    ``cuda``; on CUDA from ``free_bytes`` of device memory at ``per_position`` bytes a position)."""
    if device != "cuda":
        tokens = tokens or CPU_TOKENS
        return PassSize(tokens, rows or CPU_ROWS)
    tokens = tokens or gpu_tokens(free_bytes, per_position)
    return PassSize(tokens, rows or max(1, tokens // DEFAULT_STEPS[0]))


def per_position(source, precision: str, output: OutputSpec) -> int:
    """``device_bytes_per_position`` of the model of a ``ModelSource``."""
    return device_bytes_per_position(
        source.cell_dim, source.output_dim // 2, source.num_layers - 1, precision, output
    )


def gpu_free_bytes(gpus: float) -> int:
    """The free memory of a GPU an actor of ``gpus`` GPUs would get, asked by a task on one."""
    import ray

    def free() -> int:
        import torch

        return int(torch.cuda.mem_get_info()[0])

    return int(ray.get(ray.remote(num_gpus=gpus, num_cpus=0, max_retries=0)(free).remote()))

"""Every layer's vector of every token of a list of sentences: what the probes read.

The biLM runs stateless through ``elmo_model.static_inference`` (the inference path ``elmo embed``
runs: static shapes, on a GPU CUDA graphs), its output compacted to the real tokens, so a
sentence's vectors are the ones ``elmo embed layers=all`` would store (float32). Training calls
this on its own model (``graphs=False``: a bounded probe should not capture graphs beside the
training step's) and puts the model back in train mode after.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from elmo_model import BiLM
from elmo_model.static_batches import BucketPlan, build_passes, token_destinations
from elmo_model.static_inference import OutputSpec, StaticInference

CPU_PLAN = BucketPlan(token_budget=4096, max_rows=256)
GPU_PLAN = BucketPlan(token_budget=32768, max_rows=2048, fixed=True)


def token_features(
    bilm: BiLM, sentences: Sequence[Sequence[str]], precision: str = "float32", graphs: bool | None = None
) -> np.ndarray:
    """(tokens, N+1, 2P) float32: sentence after sentence, each token's layers (0 = the char CNN's
    token layer, then each LSTM layer), boundaries excluded."""
    was_training = bilm.training
    device = next(bilm.parameters()).device
    try:
        run = StaticInference(bilm, OutputSpec("all"), precision, graphs=graphs)
        plan = GPU_PLAN if device.type == "cuda" else CPU_PLAN
        sizes = np.array([len(s) for s in sentences], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        out = np.empty((int(sizes.sum()), bilm.num_layers, bilm.output_dim), dtype=np.float32)
        for indices, batch in build_passes(sentences, plan):
            out[token_destinations(starts, sizes, indices)] = run(batch)[: batch.tokens].float().cpu().numpy()
        return out
    finally:
        bilm.train(was_training)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

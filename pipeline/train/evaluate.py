"""Held-out perplexity as bilm-tf's run_test computes it (docs/training.md#held-out-perplexity).

Rows are continuous streams of sentences with the LSTM state carried from batch to batch, unroll
1, full softmax, no dropout. Per batch the loss is the mean cross-entropy of each direction; the
result is exp(mean of the per-batch losses), for the forward LM, the backward LM and their average
(0.5 * (fwd + bwd) per batch). Several ranks may each score their own part of the held-out split;
their ``HeldoutSums`` add up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from elmo_model import TrainingLM
from pipeline.formats.shard_manifest import ShardManifest
from pipeline.train.data import LMBatch
from pipeline.train.distributed import all_reduce_sum
from pipeline.train.errors import TrainError
from pipeline.train.objective import SharedSoftmax, direction_losses_full
from pipeline.train.sentence_source import rank_sentence_count

EVAL_UNROLL_STEPS = 1
"""run_test rebuilds the model with unroll_steps = 1."""


def check_heldout_split(shard_sentences: list[int], batch_size: int, world_size: int) -> None:
    """TrainError unless every rank's part of the held-out split (shards of ``shard_sentences``
    sentences each, as the manifest counts them) fills one evaluation batch of ``batch_size`` rows.

    With unroll 1 each row of the first batch starts on a sentence of its own, and every sentence
    yields at least one prediction (its ``</S>``): a rank needs ``batch_size`` sentences, no more.
    """
    if not sum(shard_sentences):
        raise TrainError(
            "the shards have no held-out split (sharded with heldout_fraction=0 and no heldout_input), so "
            "held-out perplexity cannot be measured: shard the corpus again into a new output with "
            "heldout_fraction above 0 (the same output would find its run complete)"
        )
    have = [rank_sentence_count(shard_sentences, rank, world_size) for rank in range(world_size)]
    fewest = min(have)
    if fewest < batch_size:
        rank = have.index(fewest)
        raise TrainError(
            f"the held-out split ({sum(shard_sentences)} sentences) gives worker {rank} of {world_size} only "
            f"{fewest} sentences, but an evaluation batch starts each of its eval_batch_size={batch_size} rows "
            f"on a sentence of its own; lower eval_batch_size to {max(fewest, 1)} or use fewer workers"
        )


@dataclass
class HeldoutSums:
    """Sums over scored batches: ``losses`` (3,) float64 [fwd, bwd, avg] per-batch mean losses, ``batches``."""

    losses: torch.Tensor
    batches: int

    def perplexities(self) -> dict[str, float]:
        """``eval/perplexity_fwd``, ``eval/perplexity_bwd``, ``eval/perplexity`` (the average's)."""
        if self.batches == 0:
            raise TrainError(
                "no held-out batch was scored: the held-out split is smaller than one evaluation batch"
            )
        mean = (self.losses / self.batches).tolist()
        return {
            "eval/perplexity_fwd": perplexity(mean[0]),
            "eval/perplexity_bwd": perplexity(mean[1]),
            "eval/perplexity": perplexity(mean[2]),
        }


def perplexity(loss: float) -> float:
    """exp(``loss``), a mean cross-entropy in nats; infinite where that overflows a float (a
    runaway's loss, which the divergence guard must still be able to judge)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def heldout_sums(
    lm: TrainingLM,
    softmax: SharedSoftmax,
    batches: Iterable[LMBatch],
    device: torch.device,
    max_batches: int = 0,
    autocast_dtype: torch.dtype | None = None,
) -> HeldoutSums:
    """Score held-out batches with ``lm`` (a ``TrainingLM``, through its ``score_window``: char ids
    (2, B, 1, 50), c, h -> top (2, B, 1, P), c, h), carrying its state. ``max_batches`` = 0 scores
    them all.

    ``lm`` is put in eval mode for the pass and restored to its previous mode after.
    """
    was_training = lm.training
    lm.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    count = 0
    c = h = None
    autocast = (
        torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
    )
    try:
        with torch.no_grad():
            for batch in batches:
                if max_batches and count >= max_batches:
                    break
                with autocast:
                    top, c, h = lm.score_window(batch.char_ids.to(device), c, h)
                losses = direction_losses_full(top, batch.targets.to(device), softmax).double().cpu()
                sums += torch.stack([losses[0], losses[1], losses.mean()])
                count += 1
    finally:
        lm.train(was_training)
    return HeldoutSums(sums, count)


class Evaluator:
    """Held-out perplexity of a run, on every rank's part of the split, summed over ranks: every
    ``eval_every`` steps (0: only at the end), and once at the end of the run.

    ``cfg``: the TrainConfig; ``batches``: opens one pass of this rank's held-out batches
    (``open_lm_batches(..., "heldout", ..., test=True)`` with ``cfg.eval_batch_size`` rows).
    """

    def __init__(
        self, cfg: Any, batches: Callable[[], Iterable[LMBatch]], baselines: Mapping[str, float], world: int
    ):
        self.cfg, self.batches, self.baselines, self.world = cfg, batches, dict(baselines), world

    def due(self, step: int, last_step: bool) -> bool:
        """An evaluation inside the run (the end-of-run one is `run`'s caller's)."""
        return self.cfg.eval_every and step % self.cfg.eval_every == 0 and not last_step

    def run(
        self, lm: TrainingLM, softmax: SharedSoftmax, device: torch.device, autocast_dtype, final: bool = True
    ) -> dict:
        """``eval/perplexity{,_fwd,_bwd}``, the ``baselines`` (RunPlan.baselines), ``eval/batches`` and
        ``eval/seconds`` (all ranks). ``final``: the end-of-run evaluation (``eval_max_batches``);
        otherwise one during the run (``eval_interval_batches``, a fixed sample)."""
        started = time.perf_counter()
        limit = eval_batches(self.cfg, final)
        max_batches = -(-limit // self.world) if limit else 0
        result = heldout_perplexities(lm, softmax, self.batches(), device, autocast_dtype, max_batches)
        result.update(self.baselines)
        result["eval/seconds"] = time.perf_counter() - started
        return result


def eval_batches(cfg: Any, final: bool) -> int:
    """Held-out batches an evaluation scores (0: all): ``eval_max_batches`` at the end of the run;
    during it the smaller of that and ``eval_interval_batches`` (either 0 means no limit of its own)."""
    limits = [cfg.eval_max_batches] if final else [cfg.eval_max_batches, cfg.eval_interval_batches]
    return min((n for n in limits if n > 0), default=0)


def final_eval_batches(cfg: Any, manifest: ShardManifest, world: int) -> int:
    """Held-out batches each of ``world`` ranks scores in the end-of-run evaluation: its share of
    ``eval_max_batches``, or of the whole split (a batch scores one target a row: every held-out
    token and each sentence's boundary)."""
    limit = eval_batches(cfg, final=True)
    if limit:
        return -(-limit // world)
    targets = manifest.totals["heldout"].targets
    return -(-targets // (cfg.eval_batch_size * EVAL_UNROLL_STEPS * world))


def heldout_perplexities(
    lm: TrainingLM,
    softmax: SharedSoftmax,
    batches: Iterable[LMBatch],
    device: torch.device,
    autocast_dtype,
    max_batches: int = 0,
) -> dict:
    """`heldout_sums` of this rank's ``batches`` summed over the ranks (every rank calls it alike): ``eval/perplexity{,_fwd,_bwd}`` and ``eval/batches``."""
    sums = heldout_sums(lm, softmax, batches, device, max_batches, autocast_dtype)
    counts = torch.cat([sums.losses, torch.tensor([float(sums.batches)], dtype=torch.float64)])
    total = all_reduce_sum(counts.to(device)).cpu()  # NCCL reduces only CUDA tensors
    result = HeldoutSums(total[:3], int(total[3])).perplexities()
    result["eval/batches"] = int(total[3])
    return result

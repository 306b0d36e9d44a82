"""What one run of a stage did, in the same shape for every stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    """``run_shard``, ``run_training`` and ``run_embed`` each return one.

    ``output``: where the stage's results are; ``seconds`` and ``tokens``: this run's own work (a
    rerun that resumed or found its output complete counts only what it did); ``complete``: False
    when the run stopped early on purpose and a rerun with the same arguments finishes it;
    ``details``: the stage's own facts (shard: ``manifest``; train: the final ``status`` row of
    metrics.jsonl; embed: shard and sentence counts, the output's ``totals``, and its ``manifest``
    once complete).
    """

    stage: str
    output: str
    seconds: float
    tokens: int
    complete: bool = True
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

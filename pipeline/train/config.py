"""TrainConfig: everything ``elmo train`` reads, as a typed config (schema -> preset -> file -> key=value).

Field defaults are the original bilm-tf recipe (docs/training.md#schedule-and-checkpoints) except where a default must be a path
(``shards``, ``output``), which have no default, and ``softmax.offset_penalty``, the divergence fix
(docs/training.md#divergence), which is 0 in bilm-tf. Presets in ``pipeline/presets/*.yaml`` set the model size
and the recipe keys for that size. Each field is documented under it; each range rule is checked
once, in ``TrainConfig.__post_init__``.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import MISSING

from pipeline.config import UseGPU, check_rules, seed_rule
from pipeline.model_config import ModelConfig
from pipeline.tracking.config import WandbConfig


class OptimizerName(enum.Enum):
    adagrad = "adagrad"
    """bilm-tf's (sparse updates of the softmax rows)."""
    adam = "adam"
    """Adam (dense moments, every softmax row moves)."""
    adamw = "adamw"
    """AdamW: Adam with ``weight_decay`` decoupled from the gradient (Loshchilov & Hutter 2019)."""


class Schedule(enum.Enum):
    constant = "constant"
    """bilm-tf's."""
    linear = "linear"
    """Linear decay to ``final_lr_fraction``."""
    cosine = "cosine"
    """Cosine decay to ``final_lr_fraction``."""


class LRRule(enum.Enum):
    auto = "auto"
    """``sqrt`` when the run trains on GPUs, ``as_given`` on CPUs (whose presets' rates were tuned
    at their own batches)."""
    sqrt = "sqrt"
    """``lr`` x sqrt(global rows / 384): bilm-tf's rate belongs to its 3 GPUs x 128 rows, and the
    GPU batch study chose this scaling (docs/training.md#the-batch-on-a-gpu)."""
    as_given = "as_given"
    """``lr`` whatever the batch."""


@dataclass
class OptimizerConfig:
    """Optimizer and learning-rate schedule."""

    name: OptimizerName = OptimizerName.adagrad
    """``adagrad`` (bilm-tf; sparse softmax updates), ``adam`` or ``adamw``."""
    lr: float = 0.2
    """Peak learning rate (bilm-tf's Adagrad default 0.2), before ``lr_rule``."""
    lr_rule: LRRule = LRRule.auto
    """How the batch scales ``lr``: ``auto`` (``sqrt`` on GPUs, ``as_given`` on CPUs), ``sqrt`` or
    ``as_given``. The rate used is ``train/lr`` in metrics.jsonl."""
    initial_accumulator: float = 1.0
    """Adagrad's initial accumulator (bilm-tf 1.0; TF Adagrad has no epsilon)."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's (beta1, beta2)."""
    adam_eps: float = 1e-8
    """Adam's epsilon."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay (each step multiplies every weight by 1 - lr x weight_decay);
    ``adam`` and ``adagrad`` take none."""
    schedule: Schedule = Schedule.constant
    """LR schedule after warm-up: ``constant`` (bilm-tf), ``linear`` or ``cosine`` decay."""
    warmup_steps: int = 0
    """Steps of linear warm-up from 0 to ``lr``."""
    final_lr_fraction: float = 0.0
    """Learning rate at the last step as a fraction of ``lr``, for ``linear`` and ``cosine``."""


@dataclass
class SoftmaxConfig:
    """The softmax shared by both directions."""

    sampled: bool = True
    """Train with the sampled softmax (docs/training.md#loss); false trains with the full softmax."""
    negatives: int = 8192
    """Unique log-uniform negatives per step, direction and worker (bilm-tf n_negative_samples_batch)."""
    sparse_exchange: bool = True
    """Exchange softmax gradients as (row ids, rows) between workers; false = dense all-reduce."""
    offset_penalty: float = 0.05
    """Weight of a penalty on |batch mean of each direction's softmax input|^2, added to the loss.
    Without it a sampled-softmax run can diverge for some seeds (docs/training.md#divergence);
    0 is bilm-tf's recipe exactly."""


class OnDivergence(enum.Enum):
    warn = "warn"
    """Say so (console, metrics.jsonl, wandb) and train on."""
    stop = "stop"
    """Say so and end the run (status ``diverged``); its checkpoints stay."""
    rollback = "rollback"
    """Reload the last checkpoint saved before the divergence, scale the learning rate by
    ``guard.lr_factor`` and train on; stop after ``guard.max_rollbacks``. With no checkpoint yet
    (a divergence before the first save) the run says so and trains on, as ``warn``."""


@dataclass
class GuardConfig:
    """The divergence guard (docs/training.md#divergence): a full-softmax perplexity of each
    direction on a fixed held-out sample at every log interval."""

    enabled: bool = True
    """Measure the guard perplexities; false turns the guard off."""
    batches: int = 16
    """Held-out batches of each rank in the sample (``eval_batch_size`` rows x 1 token, scored as
    the held-out evaluation scores them: the first ``batches`` tokens of every row)."""
    factor: float = 3.0
    """A direction diverges when its guard perplexity exceeds ``factor`` x its best so far."""
    on_divergence: OnDivergence = OnDivergence.rollback
    """``rollback`` (the default: it rescued the seed that diverged at three epochs of the sample
    corpus, docs/training.md#divergence), ``warn`` or ``stop``."""
    lr_factor: float = 0.5
    """Learning-rate multiplier each rollback applies (kept by later checkpoints and resumes)."""
    max_rollbacks: int = 3
    """Rollbacks before a run that keeps diverging stops."""


@dataclass
class TrainConfig:
    """The ``train`` stage."""

    PRESET_SECTION: ClassVar[str] = ""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The biLM architecture (ignored when ``init_from`` is set: that options.json wins)."""
    shards: str = MISSING
    """Shard directory (local path or ``s3://bucket/prefix``) written by the shard stage."""
    output: str = MISSING
    """Run directory (local path or ``s3://``): metrics.jsonl, the plot, checkpoints/ and export/."""
    name: str = ""
    """Run name (Ray, wandb). Rerunning with the same output and name resumes; empty = output's base name."""
    workers: int = 2
    """Ray Train workers, one DDP rank each."""
    threads_per_worker: int = 1
    """CPU threads each worker uses (torch.set_num_threads) and the Ray CPUs it reserves."""
    use_gpu: UseGPU = UseGPU.auto
    """``auto`` (GPUs when the cluster has them), ``true`` or ``false``."""
    bf16: bool = True
    """bf16 autocast on GPU (CPU always trains in float32)."""
    cuda_graph: bool = True
    """On GPUs, capture the whole training step in a CUDA graph after a few eager steps and replay
    it (one launch per step instead of hundreds); false runs every step eagerly."""
    max_steps: int = 0
    """Stop after this many steps; 0 = ``max_tokens``, else ``n_epochs`` epochs of the manifest's
    training tokens."""
    max_tokens: int = 0
    """Stop after this many training tokens (per direction, all workers together: the ``tokens`` of
    metrics.jsonl), rounded up to whole steps; 0 = ``n_epochs``. Not with ``max_steps``."""
    n_epochs: int = 10
    """Epochs that set the run length when ``max_steps`` and ``max_tokens`` are 0 (bilm-tf: 10)."""
    time_budget: str = ""
    """Wall time for the whole run, from the command to the exported model: ``90s``, ``45m``,
    ``2h``, ``1h30m`` or a number of seconds; empty = no budget. The run measures its pace after its
    first steps and plans its last step so that it ends on time with its final evaluation and
    export done; the learning-rate schedule decays over the planned steps. The steps of
    ``max_steps`` / ``max_tokens`` / ``n_epochs`` stay the most it runs. A resumed run finishes the
    steps first planned (docs/training.md#a-run-planned-to-its-budget)."""
    batch_size: int = 128
    """Rows per worker (bilm-tf: 128 per GPU)."""
    unroll_steps: int = 20
    """Tokens per window, the truncated-backprop length (bilm-tf: 20)."""
    dropout: float = 0.1
    """Drop probability on every LSTM layer's input and the top output (docs/training.md#network-in-training)."""
    clip_norm: float = 10.0
    """Global gradient-norm clip over all parameters, softmax included (bilm-tf: 10)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and learning-rate schedule."""
    softmax: SoftmaxConfig = field(default_factory=SoftmaxConfig)
    """Sampled or full softmax and how its gradient is exchanged."""
    eval_every: int = 0
    """Held-out perplexity every N steps; 0 = only at the end of the run."""
    eval_batch_size: int = 256
    """Rows of the held-out evaluation (bilm-tf run_test: 256)."""
    eval_max_batches: int = 0
    """Score at most this many held-out batches at the end of the run; 0 = the whole held-out split."""
    eval_interval_batches: int = 100
    """Held-out batches scored by each evaluation during the run (``eval_every``): the same first N
    of the split every time, so its cost stays fixed however large the corpus; 0 = as at the end."""
    log_every: int = 100
    """Training metrics every N steps."""
    probe_every: int = 0
    """Every N steps (and at the last), probe the model on rank 0 with a fixed sample of ``elmo
    probe``'s set (part of speech and word sense per layer: ``probe/*`` in metrics.jsonl and wandb, a
    panel of the plot); 0: never."""
    checkpoint_every: int = 1250
    """Checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 2
    """Keep the last K checkpoints (bilm-tf: 2)."""
    seed: int = 0
    """Seed of the initialisation, the data order and the sampled negatives."""
    init_from: str = ""
    """Directory (local or ``s3://``) holding options.json + weights.hdf5 to continue pretraining from
    (softmax.hdf5 + vocab.txt there are used too when the vocabulary is the same)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases tracking."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The divergence guard."""
    max_failures: int = 3
    """Times the run is started again after a worker is lost (each start resumes from the latest
    checkpoint); an error about the input or settings is never retried."""
    storage_endpoint: str = ""
    """S3 endpoint URL; empty = ``AWS_ENDPOINT_URL`` or AWS's default."""
    ray_address: str = ""
    """Ray cluster to join; empty = ``RAY_ADDRESS`` or an embedded local cluster."""
    resources_timeout_s: float = 900.0
    """On a cluster that autoscales, how long to wait for it to add the workers' resources."""

    def tokens_per_step(self, world: int) -> int:
        """Training tokens one step reads, per direction, over ``world`` workers."""
        return self.batch_size * self.unroll_steps * world

    def __post_init__(self) -> None:
        check_rules([*self._length_rules(), *self._step_rules(), *self._guard_and_schedule_rules()])

    def _length_rules(self) -> list[tuple]:
        """The run's length, its evaluations, its seed and dropout."""
        return [
            *((key, getattr(self, key), getattr(self, key) >= 1, ">= 1") for key in _AT_LEAST_ONE),
            (
                "max_steps",
                self.max_steps,
                0 <= self.max_steps < 2**63,
                "in [0, 2**63 - 1] (0: max_tokens or n_epochs)",
            ),
            (
                "max_tokens",
                self.max_tokens,
                0 <= self.max_tokens < 2**63,
                "in [0, 2**63 - 1] (0: n_epochs epochs)",
            ),
            (
                "max_tokens",
                self.max_tokens,
                not (self.max_tokens and self.max_steps),
                "0 when max_steps is set (one of the two sets the run's length)",
            ),
            ("time_budget", self.time_budget, budget_seconds(self.time_budget) is not None, BUDGET_RULE),
            ("probe_every", self.probe_every, self.probe_every >= 0, ">= 0 (0: never)"),
            ("eval_max_batches", self.eval_max_batches, self.eval_max_batches >= 0, ">= 0 (0: all)"),
            (
                "eval_interval_batches",
                self.eval_interval_batches,
                self.eval_interval_batches >= 0,
                ">= 0 (0: as eval_max_batches)",
            ),
            seed_rule(self.seed),
            ("dropout", self.dropout, 0 <= self.dropout < 1, "in [0, 1)"),
        ]

    def _step_rules(self) -> list[tuple]:
        """The softmax, the optimizer's numbers, clipping, the cluster's wait and the run's name."""
        return [
            ("softmax.negatives", self.softmax.negatives, self.softmax.negatives >= 1, ">= 1"),
            (
                "softmax.offset_penalty",
                self.softmax.offset_penalty,
                _finite(self.softmax.offset_penalty) and self.softmax.offset_penalty >= 0,
                "a number >= 0",
            ),
            (
                "optimizer.lr",
                self.optimizer.lr,
                _finite(self.optimizer.lr) and self.optimizer.lr > 0,
                "a number > 0",
            ),
            (
                "optimizer.initial_accumulator",
                self.optimizer.initial_accumulator,
                _finite(self.optimizer.initial_accumulator) and self.optimizer.initial_accumulator > 0,
                "a number > 0",
            ),
            (
                "optimizer.weight_decay",
                self.optimizer.weight_decay,
                _finite(self.optimizer.weight_decay)
                and self.optimizer.weight_decay >= 0
                and (self.optimizer.weight_decay == 0 or self.optimizer.name is OptimizerName.adamw),
                "a number >= 0, and 0 unless optimizer.name=adamw",
            ),
            (
                "optimizer.adam_eps",
                self.optimizer.adam_eps,
                _finite(self.optimizer.adam_eps) and self.optimizer.adam_eps > 0,
                "a number > 0",
            ),
            (
                "optimizer.final_lr_fraction",
                self.optimizer.final_lr_fraction,
                0 <= self.optimizer.final_lr_fraction <= 1,
                "in [0, 1]",
            ),
            ("clip_norm", self.clip_norm, _finite(self.clip_norm) and self.clip_norm > 0, "a number > 0"),
            (
                "resources_timeout_s",
                self.resources_timeout_s,
                _finite(self.resources_timeout_s) and self.resources_timeout_s > 0,
                "a number of seconds > 0",
            ),
            ("name", self.name, run_name_ok(self.name), NAME_RULE),
        ]

    def _guard_and_schedule_rules(self) -> list[tuple]:
        """The divergence guard, the warm-up and Adam's betas."""
        return [
            ("guard.batches", self.guard.batches, self.guard.batches >= 1, ">= 1"),
            (
                "guard.factor",
                self.guard.factor,
                _finite(self.guard.factor) and self.guard.factor > 1,
                "a number > 1",
            ),
            ("guard.lr_factor", self.guard.lr_factor, 0 < self.guard.lr_factor < 1, "in (0, 1)"),
            ("guard.max_rollbacks", self.guard.max_rollbacks, self.guard.max_rollbacks >= 0, ">= 0"),
            (
                "optimizer.warmup_steps",
                self.optimizer.warmup_steps,
                self.optimizer.warmup_steps >= 0,
                ">= 0",
            ),
            (
                "optimizer.adam_betas",
                list(self.optimizer.adam_betas),
                len(self.optimizer.adam_betas) == 2 and all(0 <= b < 1 for b in self.optimizer.adam_betas),
                "two numbers in [0, 1)",
            ),
        ]


BUDGET_RULE = "a duration such as 90s, 45m, 2h or 1h30m, or a number of seconds, above 0 (empty: none)"
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def budget_seconds(text: str) -> float | None:
    """``time_budget`` in seconds: 0.0 when empty, None when it is no duration (``BUDGET_RULE``)."""
    text = str(text).strip()
    if not text:
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        match = _DURATION.fullmatch(text)
        if match is None or not any(match.groups()):
            return None
        hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
        seconds = 3600 * hours + 60 * minutes + secs
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _finite(value: float) -> bool:
    return math.isfinite(value)


NAME_RULE = "at most 100 letters, digits, spaces and . _ - (empty: the output folder's name)"


def run_name_ok(name: str) -> bool:
    """A run name Ray, wandb and a file system all take."""
    return not name or (
        len(name) <= 100 and re.fullmatch(r"[\w .-]+", name) is not None and name.strip() == name
    )


_AT_LEAST_ONE = (
    "workers",
    "batch_size",
    "unroll_steps",
    "threads_per_worker",
    "n_epochs",
    "log_every",
    "checkpoint_every",
    "eval_batch_size",
    "keep_checkpoints",
)
"""TrainConfig keys that must be >= 1."""

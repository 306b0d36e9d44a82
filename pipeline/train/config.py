"""TrainConfig: everything ``elmo train`` reads, as a typed config (schema -> preset -> file -> key=value).

Field defaults are the original bilm-tf recipe (ELMO_SPEC.md section 7.7) except where a default
must be a path (``shards``, ``output``), which have no default. Presets in ``configs/*.yaml`` set
the model size and the recipe keys for that size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import MISSING

from pipeline.model_config import ModelConfig


@dataclass
class OptimizerConfig:
    """Optimizer and learning-rate schedule.

    name: ``adagrad`` (bilm-tf) or ``adam``.
    lr: peak learning rate.
    initial_accumulator: Adagrad's initial squared-gradient accumulator.
    adam_betas: Adam's (beta1, beta2).
    adam_eps: Adam's epsilon.
    schedule: ``constant``, ``linear`` (decay to ``final_lr_fraction``) or ``cosine``.
    warmup_steps: linear warm-up steps from 0 to ``lr``.
    final_lr_fraction: lr at the last step, as a fraction of ``lr`` (linear / cosine).
    """

    name: str = "adagrad"
    """``adagrad`` (bilm-tf; sparse softmax updates) or ``adam``."""
    lr: float = 0.2
    """Peak learning rate (bilm-tf's Adagrad default 0.2)."""
    initial_accumulator: float = 1.0
    """Adagrad's initial accumulator (bilm-tf 1.0; TF Adagrad has no epsilon)."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's (beta1, beta2)."""
    adam_eps: float = 1e-8
    """Adam's epsilon."""
    schedule: str = "constant"
    """LR schedule after warm-up: ``constant`` (bilm-tf), ``linear`` or ``cosine`` decay."""
    warmup_steps: int = 0
    """Steps of linear warm-up from 0 to ``lr``."""
    final_lr_fraction: float = 0.0
    """Learning rate at the last step as a fraction of ``lr``, for ``linear`` and ``cosine``."""


@dataclass
class SoftmaxConfig:
    """The softmax shared by both directions.

    sampled: sampled softmax in training (bilm-tf default); false = full softmax.
    negatives: unique negatives per step, per direction, per worker (log-uniform sampler).
    sparse_exchange: exchange only the rows a step touches between workers.
    """

    sampled: bool = True
    """Train with the sampled softmax (spec 7.4); false trains with the full softmax."""
    negatives: int = 8192
    """Unique log-uniform negatives per step, direction and worker (bilm-tf n_negative_samples_batch)."""
    sparse_exchange: bool = True
    """Exchange softmax gradients as (row ids, rows) between workers; false = dense all-reduce."""


@dataclass
class WandbConfig:
    """Weights & Biases tracking.

    mode: ``offline`` (default), ``online`` (needs WANDB_API_KEY) or ``disabled``.
    project: wandb project.
    entity: wandb entity (team or user); empty = the key's default.
    """

    mode: str = "offline"
    """``offline`` (default; the run lands in RUN_DIR/wandb), ``online`` (needs WANDB_API_KEY) or ``disabled``."""
    project: str = "elmo-pipeline"
    """wandb project name."""
    entity: str = ""
    """wandb entity (team or user); empty uses the API key's default."""


@dataclass
class TrainConfig:
    """The ``train`` stage.

    model: the biLM architecture (ignored when ``init_from`` is set: the options.json there wins).
    shards: shard directory (local or ``s3://``) written by the shard stage.
    output: run directory (local or ``s3://``): metrics.jsonl, plot, checkpoints, export/.
    name: run name; rerunning with the same name and output resumes. Empty = output's base name.
    workers: Ray Train workers (DDP ranks).
    threads_per_worker: CPU threads (and Ray CPUs) per worker.
    use_gpu: ``auto``, ``true`` or ``false``.
    bf16: bf16 autocast on GPU.
    cuda_graph: replay the training step as a CUDA graph on GPUs.
    max_steps: stop after this many steps; 0 = n_epochs epochs.
    n_epochs: epochs that set the run length when max_steps is 0.
    batch_size: rows per worker.
    unroll_steps: window length (truncated backprop length).
    dropout: drop probability.
    clip_norm: global gradient-norm clip.
    optimizer: optimizer and lr schedule.
    softmax: sampled / full softmax and gradient exchange.
    eval_every: held-out evaluation every N steps (0 = only at the end).
    eval_batch_size: rows of the held-out evaluation.
    eval_max_batches: cap on held-out batches (0 = the whole held-out split).
    log_every: training metrics every N steps.
    checkpoint_every: checkpoint every N steps.
    keep_checkpoints: keep the last K checkpoints.
    seed: seed of initialisation, data order and negatives.
    init_from: directory with options.json + weights.hdf5 to continue pretraining from.
    wandb: tracking settings.
    max_failures: worker-group restarts Ray may do.
    storage_endpoint: S3 endpoint URL (default AWS_ENDPOINT_URL).
    ray_address: Ray cluster address (default RAY_ADDRESS or an embedded cluster).
    """

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
    use_gpu: str = "auto"
    """``auto`` (GPUs when the cluster has them), ``true`` or ``false``."""
    bf16: bool = True
    """bf16 autocast on GPU (CPU always trains in float32)."""
    cuda_graph: bool = True
    """On GPUs, capture the whole training step in a CUDA graph after a few eager steps and replay
    it (one launch per step instead of hundreds); false runs every step eagerly."""
    max_steps: int = 0
    """Stop after this many steps; 0 = ``n_epochs`` epochs of the manifest's training tokens."""
    n_epochs: int = 10
    """Epochs that set the run length when ``max_steps`` is 0 (bilm-tf: 10)."""
    batch_size: int = 128
    """Rows per worker (bilm-tf: 128 per GPU)."""
    unroll_steps: int = 20
    """Tokens per window, the truncated-backprop length (bilm-tf: 20)."""
    dropout: float = 0.1
    """Drop probability on every LSTM layer's input and the top output (spec 7.3)."""
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
    """Score at most this many held-out batches; 0 = the whole held-out split."""
    log_every: int = 100
    """Training metrics every N steps."""
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
    max_failures: int = 3
    """Times Ray restarts the worker group after a worker dies (each resumes from the latest checkpoint)."""
    storage_endpoint: str = ""
    """S3 endpoint URL; empty = ``AWS_ENDPOINT_URL`` or AWS's default."""
    ray_address: str = ""
    """Ray cluster to join; empty = ``RAY_ADDRESS`` or an embedded local cluster."""

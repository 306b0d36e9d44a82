"""PipelineConfig: the whole pipeline (shard -> train -> evaluate -> export -> embed, then the probe
unless ``run_probe=false``) as one job.

It nests the four stage configs unchanged, so every stage key is settable as ``shard.*``,
``train.*``, ``embed.*`` or ``probe.*``, and adds the few keys that tie the stages together: where
the run lives (``storage``, ``name``) and what corpus goes in. Paths between stages are derived
from ``storage``/``name`` unless a user sets them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.config import check_rules
from pipeline.embed.config import EmbedConfig
from pipeline.probe.config import ProbeConfig
from pipeline.shard.config import ShardConfig, TokenizerName
from pipeline.train.config import TrainConfig


class EmbedSplit(enum.Enum):
    heldout = "heldout"
    train = "train"


def _demo_train() -> TrainConfig:
    # The demo's budget (10 minutes on 2 cores for the whole pipeline) sets the step count; a
    # preset or the user can change it like any other key.
    return TrainConfig(workers=2, max_steps=400, eval_every=200, checkpoint_every=200, log_every=20)


@dataclass
class PipelineConfig:
    """The end-to-end job (``elmo pipeline``, ``make demo``)."""

    PRESET_SECTION: ClassVar[str] = "train"

    corpus: list[str] = field(default_factory=list)
    """Input text files or globs (local or s3://); empty = the sample corpus shipped in the package."""
    storage: str = "runs"
    """Root of everything the run writes: a local directory or an ``s3://bucket/prefix``."""
    name: str = "demo"
    """Run name; outputs go to ``<storage>/<name>/{shards,train,embeddings,probe}``."""
    embed_split: EmbedSplit = EmbedSplit.heldout
    """Which shard split the embed stage embeds (``heldout`` or ``train``)."""
    ray_address: str = ""
    """Ray cluster to join; empty starts an embedded local cluster (or uses RAY_ADDRESS)."""
    num_cpus: int = 0
    """CPUs of the embedded cluster; 0 = all of this machine's."""
    shard: ShardConfig = field(
        default_factory=lambda: ShardConfig(
            tokenizer=TokenizerName.moses, heldout_fraction=0.02, kneser_ney_orders=[3, 5]
        )
    )
    """Stage 1 settings (input/output derived unless set); the demo counts the Kneser-Ney 3- and
    5-gram, so its summary and curves show the biLM against both."""
    train: TrainConfig = field(default_factory=_demo_train)
    """Stage 2 settings (shards/output/name derived unless set); presets apply here."""
    embed: EmbedConfig = field(default_factory=lambda: EmbedConfig(workers=2))
    """Stage 3 settings (model/input/output derived unless set)."""
    run_probe: bool = True
    """End with ``elmo probe`` of the trained model beside a random one of its size: what each layer
    learned of part of speech and word sense, and what pretraining bought."""
    probe: ProbeConfig = field(default_factory=lambda: ProbeConfig(control=True))
    """The probe's settings (model/output derived unless set)."""

    def __post_init__(self) -> None:
        name = self.name
        one_segment = bool(name.strip()) and not set(name) & {"/", "\\", "\0"} and name not in (".", "..")
        # a name with a separator or a dot-dot would put the run outside (or across) ``storage``
        check_rules([("name", name, one_segment, "one folder name (no '/', '\\', '.' or '..')")])

"""ProbeConfig: what ``elmo probe`` reads (schema -> file -> flags -> key=value)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from elmo_model.precision import Precision
from pipeline.config import check_rules, seed_rule
from pipeline.model_loader import Device
from pipeline.tracking.config import WandbConfig


@dataclass
class ProbeConfig:
    """What each layer of a trained biLM knows (``elmo probe``): part of speech and word sense."""

    model: str = ""
    """Model folder, local or ``s3://``, holding ``options.json`` and ``weights.hdf5`` (what ``elmo train``
    exports). Leave empty and set ``options_file`` + ``weights_file`` instead."""
    options_file: str = ""
    """The model's options.json (local or s3://); used with ``weights_file`` when ``model`` is empty."""
    weights_file: str = ""
    """The model's HDF5 weights (local or s3://); used with ``options_file``."""
    output: str = MISSING
    """Folder (local or ``s3://``) for ``probe.json`` and ``probe.png``: new, empty, or an earlier probe's."""
    probe_set: str = ""
    """Folder with ``pos.jsonl.gz`` and ``wsd.jsonl.gz`` (``python -m pipeline.tools.build_probe_set``); empty:
    the set the package ships (Brown and WordNet 3.0, pipeline/data/probe/SOURCES.md)."""
    pos_train_sentences: int = 4000
    """Training sentences of the part-of-speech classifiers, spread over the set's (0: all 8,000)."""
    pos_test_sentences: int = 2000
    """Test sentences of the part-of-speech probe (0: all 2,000)."""
    wsd_examples: int = 0
    """WordNet examples of the word-sense probe, whole lemmas spread over the set (0: all 26,858, of
    which the 9,980 whose sense has another example are scored)."""
    control: bool = False
    """Probe a randomly initialised model of the same size too (the standard control: what the
    layers know before any pretraining) and show both."""
    seed: int = 0
    """Seed of the random control's initialisation."""
    device: Device = Device.auto
    """``auto`` (a GPU when this process sees one), ``cuda`` or ``cpu``."""
    precision: Precision = Precision.float32
    """The forward's arithmetic: ``float32`` (exact), ``tf32`` or ``bf16`` (on GPUs)."""
    threads: int = 0
    """torch threads on a CPU; 0: the cores idle at the start (the usable cores times the machine's idle share over half a second, at least 1: all of them on a quiet machine). More threads than free cores make the probe slower, not faster (pipeline/runtime/cpu_threads.py)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases: the stage's run in ``wandb.group`` (docs/outputs.md#the-dashboard), offline by
    default into OUTPUT/wandb; ``wandb.mode=disabled`` logs nothing."""

    def __post_init__(self) -> None:
        check_rules(
            [
                ("output", self.output, bool(str(self.output).strip()), "a folder or an s3:// prefix"),
                (
                    "pos_train_sentences",
                    self.pos_train_sentences,
                    self.pos_train_sentences >= 0,
                    ">= 0 (0: all)",
                ),
                (
                    "pos_test_sentences",
                    self.pos_test_sentences,
                    self.pos_test_sentences >= 0,
                    ">= 0 (0: all)",
                ),
                ("wsd_examples", self.wsd_examples, self.wsd_examples >= 0, ">= 0 (0: all)"),
                ("threads", self.threads, self.threads >= 0, ">= 0 (0: the free cores)"),
                seed_rule(self.seed),
            ]
        )

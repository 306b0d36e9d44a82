"""What an embed run's actors and preparing tasks are told (``EmbedSettings``), and what follows
from it: the pass shapes for a device, what the CPU operator prepares, how many shards an actor
works on at once."""

from __future__ import annotations

from dataclasses import dataclass

from elmo_model.static_batches import BucketPlan
from pipeline.embed.config import (
    FileFormat,
    InvalidUTF8,
    LayerMode,
    Layout,
    LongSentences,
    Pool,
    Precision,
    StoredDType,
)
from pipeline.embed.shard_work import WorkSettings
from pipeline.model_loader import pick_device


@dataclass(frozen=True)
class EmbedSettings:
    """What the actors and the preparing tasks need from EmbedConfig: its choices as its own enums
    (a name such as ``"top"`` is taken too, and checked), plus the ``threads`` and ``device`` the
    driver resolved. The plain values go only where a pure function or a file needs them."""

    layers: LayerMode
    dtype: StoredDType
    stateful: bool
    batch_tokens: int
    max_batch_sentences: int
    stateful_batch_size: int
    max_sentence_tokens: int
    long_sentences: LongSentences
    invalid_utf8: InvalidUTF8
    threads: int
    device: str
    precision: Precision = Precision.float32
    pool: Pool = Pool.none
    layout: Layout = Layout.allennlp
    file_format: FileFormat = FileFormat.hdf5

    def __post_init__(self) -> None:
        for name, kind in _CHOICES.items():
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def pooled(self) -> bool:
        return self.pool is Pool.mean


_CHOICES = {
    "layers": LayerMode,
    "dtype": StoredDType,
    "long_sentences": LongSentences,
    "invalid_utf8": InvalidUTF8,
    "precision": Precision,
    "pool": Pool,
    "layout": Layout,
    "file_format": FileFormat,
}


def bucket_plan(settings: EmbedSettings, device_type: str) -> BucketPlan:
    """The pass shapes for actors on ``device_type``: fixed buckets for CUDA graphs, shrinking
    passes elsewhere."""
    return BucketPlan(settings.batch_tokens, settings.max_batch_sentences, fixed=device_type == "cuda")


def work_settings(settings: EmbedSettings) -> WorkSettings:
    """What the CPU operator needs to prepare shards for actors on ``settings.device``."""
    return WorkSettings(
        stateful=settings.stateful,
        max_sentence_tokens=settings.max_sentence_tokens,
        long_sentences=settings.long_sentences,
        invalid_utf8=settings.invalid_utf8,
        plan=bucket_plan(settings, pick_device(settings.device).type),
    )


def concurrent_calls(settings: EmbedSettings) -> int:
    """Shards an actor works on at once: one in the model, the others written beside it, one per
    CPU the actor holds (at least one); stateful, one (its shards go through in order)."""
    return 1 if settings.stateful else max(2, settings.threads)

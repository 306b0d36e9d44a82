"""What an embed run's actors and preparing tasks are told (``EmbedSettings``), and what follows
from it: the pass shapes for a device, what the CPU operator prepares, how many shards an actor
works on at once."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from elmo_model.static_batches import BucketPlan
from pipeline.embed.config import EmbedConfig, Pool
from pipeline.embed.file_format import EmbeddingFormat, chosen_format
from pipeline.embed.record_inputs import RecordReading
from pipeline.embed.shard_work import WorkSettings
from pipeline.formats.records import RecordFields
from pipeline.model_loader import pick_device


@dataclass(frozen=True)
class EmbedSettings:
    """What the actors and the preparing tasks are told: ``config``, the run's EmbedConfig (its
    choices as the config holds them: ``layers``, ``dtype``, ``stateful``, ``pool`` ...), and what
    the driver resolved for the actors' device: the pass size (``batch_tokens`` tokens of at most
    ``max_batch_sentences`` rows), the ``threads`` of each actor and the ``device``."""

    config: EmbedConfig
    batch_tokens: int
    max_batch_sentences: int
    threads: int
    device: str

    @property
    def pooled(self) -> bool:
        return self.config.pool is Pool.mean

    @functools.cached_property
    def file_format(self) -> EmbeddingFormat:
        """The format every shard of the run is written in, bound to its layout: looked up once."""
        return chosen_format(self.config.format.value, self.config.layout.value)


def bucket_plan(settings: EmbedSettings, device_type: str) -> BucketPlan:
    """The pass shapes for actors on ``device_type``: fixed buckets for CUDA graphs, shrinking
    passes elsewhere."""
    return BucketPlan(settings.batch_tokens, settings.max_batch_sentences, fixed=device_type == "cuda")


def record_reading(config: EmbedConfig) -> RecordReading:
    """How the run reads a record corpus's records (the driver's plan and the tasks alike)."""
    fields = RecordFields(text=config.text_field, id=config.id_field)
    return RecordReading(fields, config.split_sentences, config.max_record_bytes)


def work_settings(settings: EmbedSettings) -> WorkSettings:
    """What the CPU operator needs to prepare shards for actors on ``settings.device``."""
    config = settings.config
    return WorkSettings(
        stateful=config.stateful,
        max_sentence_tokens=config.max_sentence_tokens,
        long_sentences=config.long_sentences,
        invalid_utf8=config.invalid_utf8,
        plan=bucket_plan(settings, pick_device(settings.device).type),
        records=record_reading(config),
        tokenizer=config.tokenizer,
        moses_lang=config.moses_lang,
    )


def concurrent_calls(settings: EmbedSettings) -> int:
    """Shards an actor works on at once: one in the model, the others written beside it, one per
    CPU the actor holds (at least one); stateful, one (its shards go through in order)."""
    return 1 if settings.config.stateful else max(2, settings.threads)

"""A shard's CPU-side work: what a CPU operator prepares so that the model actor only runs passes,
and how the actor's per-piece values become one value per line again.

``prepare_shard`` (Ray Data's CPU operator, ``pipeline.embed.dataflow``): read the shard's lines,
decode, clean and tokenize them (``sentences``), and, stateless, plan the forward passes and build
their arrays (``elmo_model.static_batches``: character ids of each distinct token, positions,
reverse indices), with the bucket shapes of the device the actors run on. Stateful mode keeps the
token lists: its passes are input-order batches that ``BiLM.forward`` runs as today.

The actor places the passes' outputs into the shard's vectors by piece (``owner``, ``sizes``:
``shard_vectors``). A shard's work is a few bytes per token (int32 positions, int16 characters per
distinct token), a small fraction of its vectors, so it travels through Ray's object store cheaply.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field

from elmo_model.static_batches import BucketPlan, StaticBatch, build_passes
from pipeline.embed.config import InvalidUTF8, LongSentences
from pipeline.embed.errors import WORKER_ERRORS, EmbedError
from pipeline.embed.inputs import ShardSpec, read_input
from pipeline.embed.record_inputs import RecordReading, RecordStreams
from pipeline.embed.sentences import PreparedLines, prepare_lines
from pipeline.embed.shard_vectors import RecordKeys
from pipeline.formats.tokenizer import TokenizerName, make_tokenizer


@dataclass(frozen=True)
class WorkSettings:
    """What preparing a shard needs from the embed settings."""

    stateful: bool
    max_sentence_tokens: int
    long_sentences: LongSentences
    invalid_utf8: InvalidUTF8
    plan: BucketPlan
    records: RecordReading | None = None
    """How a record corpus's records become sentences (read for record shards only)."""
    tokenizer: TokenizerName = TokenizerName.whitespace
    moses_lang: str = "en"

    def __post_init__(self) -> None:  # a choice's name is taken too, and checked
        object.__setattr__(self, "long_sentences", LongSentences(self.long_sentences))
        object.__setattr__(self, "invalid_utf8", InvalidUTF8(self.invalid_utf8))
        object.__setattr__(self, "tokenizer", TokenizerName(self.tokenizer))

    def tokenize(self) -> Callable[[str], list[str]]:
        """The run's tokenizer (a Moses one built once per process)."""
        return make_tokenizer(self.tokenizer.value, self.moses_lang)


@dataclass
class ShardWork:
    """One shard, ready for the model.

    ``owner[p]`` / ``sizes[p]``: the line (counted from the shard's first) and token count of piece
    ``p`` (lines split at ``max_sentence_tokens`` have several pieces; empty lines none).
    ``passes``: stateless, (piece indices, ``StaticBatch``) per forward pass; ``pieces``: stateful,
    the token lists in input order. ``error``: a one-line problem found while preparing (the shard
    is then not embedded; the driver raises it). ``records``: a record corpus's keys of each line.
    """

    spec: ShardSpec
    write: bool
    stats: dict = field(default_factory=dict)
    num_lines: int = 0
    owner: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    passes: list[tuple[list[int], StaticBatch]] = field(default_factory=list)
    pieces: list[list[str]] = field(default_factory=list)
    error: str = ""
    records: RecordKeys | None = None

    def to_bytes(self) -> bytes:
        return pickle.dumps(self, protocol=5)

    @staticmethod
    def from_bytes(data: bytes) -> ShardWork:
        # only ever bytes that this pipeline's own CPU operator made in the same job
        return pickle.loads(data)  # noqa: S301


def shard_stats(spec: ShardSpec, prepared: PreparedLines) -> dict:
    """The manifest fields known once a shard's lines are read."""
    return {
        "index": spec.index,
        "first_line": spec.first_line,
        "end_line": spec.first_line + spec.num_lines,
        "sentences": prepared.num_lines,
        "tokens": prepared.num_tokens,
        "empty_sentences": prepared.empty_sentences,
        "invalid_utf8_lines": prepared.invalid_utf8_lines,
        "control_char_lines": prepared.control_char_lines,
        "split_sentences": prepared.split_sentences,
        "input_sha256": spec.input_sha256,
    }


def work_from_lines(
    spec: ShardSpec, write: bool, prepared: PreparedLines, settings: WorkSettings
) -> ShardWork:
    """The passes (stateless) or ordered pieces (stateful) of ``prepared``, the lines of ``spec``."""
    work = ShardWork(spec, write, shard_stats(spec, prepared), prepared.num_lines)
    flat: list[list[str]] = []
    for line, pieces in enumerate(prepared.pieces):
        if settings.stateful and len(pieces) > 1:
            raise EmbedError(
                f"line {prepared.first_line + line} has more than max_sentence_tokens={settings.max_sentence_tokens} "
                "tokens: stateful mode cannot split it (splitting would change the batch rows); raise max_sentence_tokens"
            )
        flat.extend(pieces)
        work.owner.extend([line] * len(pieces))
        work.sizes.extend(len(piece) for piece in pieces)
    if settings.stateful:
        work.pieces = flat
    else:
        work.passes = build_passes(flat, settings.plan)
    return work


def prepare_shard(
    spec: ShardSpec, write: bool, settings: WorkSettings, streams: RecordStreams | None = None
) -> ShardWork:
    """Read and prepare one shard (``streams``: where a compressed record file is read on from,
    kept by the caller across its shards); a one-line input problem becomes ``ShardWork.error``."""
    try:
        lines, records = read_input(spec, settings.records, streams)
        prepared = prepare_lines(
            lines,
            spec.first_line,
            max_tokens=settings.max_sentence_tokens,
            long_sentences=settings.long_sentences.value,
            invalid_utf8=settings.invalid_utf8.value,
            where=spec.segments[0].path if spec.segments else "input",
            tokenize=settings.tokenize(),
        )
        work = work_from_lines(spec, write, prepared, settings)
        work.records = records
        return work
    except WORKER_ERRORS as err:
        return ShardWork(spec, write, error=str(err))

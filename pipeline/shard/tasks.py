"""The shard stage's Ray tasks and what each is handed: the counting, deduplicating, writing and
describing tasks of :mod:`pipeline.shard.job`, each a thin call into the pure modules (``passes``,
``duplicates``, ``writer``), with a frozen payload dataclass instead of long argument lists."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import ray

from pipeline.formats.shard_format import FormatError, shard_name
from pipeline.runtime import storage
from pipeline.shard.duplicates import chunk_drops, decode_drops, drops_name, encode_drops, find_duplicates
from pipeline.shard.errors import ShardError
from pipeline.shard.passes import LineSettings, count_chunk, deduplicate_chunk, encode_chunk, retokenize
from pipeline.shard.sentences import LineStats, Sentences
from pipeline.shard.writer import ShardRecord, build_shard, describe_shard

KEEP_MIN_BYTES = 100 * 1024
"""A counting task's tokenized chunk is kept for the writing pass only from this size on. Ray
returns smaller objects (under its ``max_direct_call_object_size``, 100 KiB by default) into the
driver's own memory rather than the object store, where nothing would spill them: small chunks
(a small ``chunk_bytes``, or chunks of mostly skipped lines) are tokenized again instead."""


class VocabularyIndex:
    """A Ray worker process's token -> id index of the run's vocabulary, built on its first
    writing-pass task and reused by the next ones (one vocabulary at a time).

    Ray tasks have no other per-process state: without it every task would fetch and index the
    whole vocabulary again, about 0.35 s for the original 793k words on this project's machine,
    against some 0.5 s of work per default 4 MiB chunk."""

    def __init__(self) -> None:
        self.sha, self.index = "", {}

    def get(self, sha: str, vocab_box: list) -> dict[str, int]:
        if sha != self.sha:
            self.sha, self.index = sha, {t: i for i, t in enumerate(ray.get(vocab_box[0]))}
        return self.index


VOCABULARY_INDEX = VocabularyIndex()


@ray.remote(num_returns=3)
def count_task(chunk, settings):
    """-> ``(summary, counts, kept)`` for the driver, the tokenized chunk when ``kept`` (else
    None), which stays in the object store until the next pass takes it, and, in a deduplicating
    run, the chunk's keys (else None)."""
    summary_, counts, sentences, keys = count_chunk(chunk, settings)
    keep = sentences.nbytes >= KEEP_MIN_BYTES
    return (summary_, counts, keep), sentences if keep else None, keys


@ray.remote(num_returns=2)
def find_task(keys_box, lo, hi):
    """The later copies among the sentences hashed into ``[lo, hi)`` (duplicates.find_duplicates),
    and the chunks they are in (for the driver: a chunk without any is left as it is);
    ``keys_box``: every chunk's keys' ObjectRef, in chunk order, boxed so that Ray passes the refs."""
    found = find_duplicates(ray.get(keys_box[0]), lo, hi)
    return found, np.unique(found >> np.uint64(32)).astype(np.int64)


@dataclass(frozen=True)
class DedupJob:
    """What one chunk's deduplicating task needs: the line ``settings`` (to read it again), the
    run's ``output`` (where its removed positions are kept), ``found_box`` (every hash range's
    find_duplicates result, boxed), and the chunk's ``index``, ``source`` and counting ``expected``."""

    settings: LineSettings
    output: str
    found_box: list
    index: int
    source: int
    expected: LineStats


@ray.remote(num_returns=2)
def dedup_task(source, job: DedupJob):
    """-> ``(summary, counts, kept)`` as the counting task's, of the chunk without its duplicates,
    and that chunk when ``kept``. Its removed positions are written down first
    (duplicates.drops_name), for a writing pass or rerun that reads the chunk again."""
    sentences = source if isinstance(source, Sentences) else retokenize(source, job.settings, job.expected)
    drops = chunk_drops(ray.get(job.found_box[0]), job.index)
    if len(drops):
        storage.write_bytes(storage.join(job.output, drops_name(job.index)), encode_drops(drops))
    summary_, counts, sentences = deduplicate_chunk(sentences, job.index, job.source, drops)
    keep = sentences.nbytes >= KEEP_MIN_BYTES
    return (summary_, counts, keep), sentences if keep else None


@dataclass(frozen=True)
class ShardOutput:
    """Where and how this run writes its shards (the same for every shard). ``unigram_box``: the
    ObjectRef of the training unigram's log-probabilities (boxed: only held-out writers fetch it),
    which score each held-out shard for the manifest (pipeline.formats.unigram)."""

    output: str
    seed: int
    block_tokens: int
    unk_id: int
    unigram_box: list

    def write(self, key: tuple[str, int], pieces) -> dict[tuple[str, int], ShardRecord]:
        split, shard = key
        name = shard_name(split, shard)
        path = storage.join(self.output, name)
        log_probs = ray.get(self.unigram_box[0]) if split == "heldout" else None
        return {
            key: build_shard(
                path, name, pieces, split, shard, self.seed, self.block_tokens, self.unk_id, log_probs
            )
        }


@dataclass(frozen=True)
class EncodeJob:
    """What one writing-pass task needs besides its chunk.

    Run-wide: ``settings`` (line handling, to read a chunk again), ``vocab_box`` (the vocabulary's
    tokens, boxed so that a task fetches them only when its process has no index of them yet) and
    its ``vocab_sha``, ``shard_tokens``, ``out``. This chunk's: ``offsets`` / ``shards`` (per split,
    from the layout), ``expected`` (its counting-pass stats), and the shards it writes itself
    (``own``: fed by this chunk alone) or cuts pieces of for their writer tasks (``shared``).
    """

    settings: LineSettings
    vocab_box: list
    vocab_sha: str
    shard_tokens: int
    out: ShardOutput
    index: int
    offsets: dict[str, int]
    shards: dict[str, range]
    expected: LineStats
    own: list[tuple[str, int]]
    shared: list[tuple[str, int]]

    def read_again(self, chunk) -> Sentences:
        """The chunk tokenized again, without the duplicates the run removed from it."""
        removed = self.expected.train_duplicates + self.expected.heldout_duplicates
        drops, name = None, drops_name(self.index)
        if removed:
            try:
                data = storage.read_bytes(storage.join(self.out.output, name))
            except storage.StorageError as err:
                raise ShardError(f"cannot read {name}, the duplicates of chunk {self.index}: {err}") from None
            drops = decode_drops(data, removed, name)
        return retokenize(chunk, self.settings, self.expected, drops, name)


@ray.remote
def encode_task(source, job: EncodeJob):
    """``source``: the counting pass's Sentences (Ray resolves the ref), or the Chunk read again.

    Writes the shards in ``job.own`` itself, and returns their records, then the pieces of the
    ``job.shared`` shards for their writer tasks: a shard inside one chunk costs no writer task and
    no piece objects (with the default chunk size, most shards)."""
    index = VOCABULARY_INDEX.get(job.vocab_sha, job.vocab_box)
    sentences = source if isinstance(source, Sentences) else job.read_again(source)
    pieces = encode_chunk(sentences, index, job.offsets, job.shards, job.shard_tokens)
    records = {}
    for key in job.own:
        records.update(job.out.write(key, [pieces[key]]))
    return (records, *(pieces[key] for key in job.shared)) if job.shared else records


@ray.remote
def write_task(out, key, *pieces):
    return out.write(key, pieces)


@ray.remote
def describe_task(path, name, unk_id, unigram_box):
    log_probs = ray.get(unigram_box[0]) if name.startswith("heldout") else None
    try:
        return describe_shard(path, name, unk_id, log_probs)
    except FormatError:
        return None  # not a readable shard: rewrite it

"""The shard stage's Ray shell: read, count, deduplicate, plan, write, score, record. The work
itself is in the pure modules next to this one, and the Ray tasks that call them in
:mod:`pipeline.shard.tasks`; this module only moves chunks and results between them.

Flow (every step deterministic, so 1 or N workers give the same bytes):

1. Inputs are resolved; an existing output is inspected (:mod:`pipeline.shard.resume`). A run that
   finds its own plan and vocabulary (an interrupted run of the same identity) skips to step 5.
2. Counting pass: the driver streams the inputs as chunks (:mod:`reader`); Ray tasks tokenize and
   count them (:func:`passes.count_chunk`), refusing a reserved word, and (``dedup``) hash each
   sentence. Each task's tokenized chunk (compact: local vocabulary, int32 local ids, UTF-8 lines)
   stays in Ray's object store for the next pass; the driver holds only its ObjectRef.
3. Deduplicating pass (``dedup``, :mod:`duplicates`): one task per hash range finds the later
   copies, then one task per chunk that has any removes them, writes their positions under
   ``duplicates/`` (for a pass that reads the chunk again) and says which counts to take off.
4. The driver sums the counts and builds the vocabulary, writes ``vocab.txt`` /
   ``vocab_counts.tsv`` and the plan (``shard_plan.json``).
5. Layout (:mod:`layout`): which chunks feed which shard. Shards an interrupted run wrote are
   read back and kept.
6. Writing pass: Ray tasks map each chunk to vocabulary ids and cut it into per-shard pieces
   (:func:`passes.encode_chunk`), without reading or tokenizing the input again. A shard that
   lies inside one chunk is written by that task at once; the pieces of a shard that spans chunks
   stay in the object store until its last chunk is submitted, and then a writer task takes them,
   shuffles, blocks and writes the tar. Chunks that were not kept (a rerun that reuses the plan,
   or a chunk under :data:`tasks.KEEP_MIN_BYTES`) are read and tokenized again, and checked
   against the counting pass's summary.
7. Baselines (:mod:`baseline`): the held-out split's Kneser-Ney model of each of ``kneser_ney_orders``,
   counted on the training shards (and, with ``kneser_ney_arpa``, written as an ARPA file).
8. ``manifest.json`` is written last; it marks the output complete. The plan stays beside it, so
   that a rerun after losing the manifest or a shard still knows the shards are its own; it is
   the one file whose bytes depend on ``chunk_bytes``.

At most ``2 * workers`` tasks are unfinished at any time, which bounds the memory in flight.
Between the passes the kept chunks (about twice the input text for English: the text plus 4
bytes of id per token) are in the object store, not in the driver, which holds one ObjectRef and
one summary per chunk. Ray also keeps each counting task's input chunk while its result is
referenced (lineage, so that a result lost with a node can be recomputed), so the store holds
about three times the input text. Ray spills objects to local disk when they outgrow the store
(its default object spilling; tested with a 150 MiB store: 684 MiB spilled, same bytes out), so a
corpus larger than memory needs that much free disk on the nodes instead. A chunk and its input
are released once its pieces are cut.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import ray

from pipeline.config import to_dict
from pipeline.formats import kneser_ney
from pipeline.formats.records import RecordFields
from pipeline.formats.shard_format import (
    COUNTS_FILE,
    MANIFEST_FILE,
    SPLITS,
    UNK_ID,
    VOCAB_FILE,
    shard_name,
)
from pipeline.formats.shard_manifest import ShardManifest
from pipeline.formats.unigram import training_target_counts, unigram_log_probs
from pipeline.output_folder import Lease, taken_back_on_failure
from pipeline.runtime import storage
from pipeline.runtime.ray_runtime import RaySession
from pipeline.shard.baseline import BaselinePlan, kneser_ney_baseline
from pipeline.shard.config import ShardConfig
from pipeline.shard.duplicates import (
    hash_ranges,
)
from pipeline.shard.errors import ReservedWordError, ShardError
from pipeline.shard.layout import SplitLayout, layout_split
from pipeline.shard.manifest import (
    OWN_FILES,
    PLAN_FILE,
    build_manifest,
    build_plan,
    encode_json,
    plan_chunks,
    run_identity,
)
from pipeline.shard.passes import (
    ChunkSummary,
    LineSettings,
)
from pipeline.shard.progress import BaselineBars, Progress
from pipeline.shard.reader import Reading, iter_chunks, resolve_inputs
from pipeline.shard.resume import (
    chunk_sources,
    claim_output,
    inspect_output,
    is_complete,
    output_prefix,
    read_vocabulary,
)
from pipeline.shard.sentences import LineStats
from pipeline.shard.task_window import TaskWindow, get
from pipeline.shard.tasks import (
    DedupJob,
    EncodeJob,
    ShardOutput,
    count_task,
    dedup_task,
    describe_task,
    encode_task,
    find_task,
    write_task,
)
from pipeline.shard.vocabulary import TokenCounts, Vocabulary, build_vocabulary
from pipeline.shard.writer import ShardRecord
from pipeline.stage import StageResult


@dataclass(frozen=True)
class _ShardRun:
    """The facts of one shard run that every pass reads: the input ``paths`` (main inputs, then
    held-out ones), the ``output``, the resolved ``config``, the line ``settings``,
    and ``window``: how many Ray tasks may be unfinished at once."""

    paths: list[str]
    output: str
    config: ShardConfig
    settings: LineSettings
    window: int


def _settings(config: ShardConfig, main_sources: int) -> LineSettings:
    return LineSettings(
        tokenizer=config.tokenizer.value,
        moses_lang=config.moses_lang,
        lowercase=config.lowercase,
        heldout_fraction=config.heldout_fraction,
        main_sources=main_sources,
        dedup=config.dedup,
        reading=Reading(
            chunk_bytes=config.chunk_bytes,
            max_line_bytes=config.max_line_bytes,
            max_record_bytes=config.max_record_bytes,
            input_format=config.input_format.value,
            fields=RecordFields(text=config.text_field),
            split_sentences=config.split_sentences,
        ),
    )


def _check_writable(output: str) -> None:
    try:
        storage.probe_writable(output)
    except storage.StorageError as err:
        raise ShardError(f"output {output} is not writable: {err}") from None


class _Counted:
    """What a counting (or deduplicating) pass gathers as its tasks finish: chunk index -> summary,
    the training token counts, and chunk index -> ObjectRef of the tokenized chunk, for the chunks
    that were kept."""

    def __init__(self, progress: Progress, counts: TokenCounts | None = None):
        self.summaries: dict[int, ChunkSummary] = {}
        self.counts = TokenCounts() if counts is None else counts
        self.kept: dict[int, ray.ObjectRef] = {}
        self.progress = progress

    def absorb(self, sentences_ref, result) -> None:
        summary_, chunk_counts, keep = result
        self.summaries[summary_.index] = summary_
        if keep:
            self.kept[summary_.index] = sentences_ref
        if chunk_counts is not None:
            self.counts.add(*chunk_counts)
        stats = summary_.stats
        self.progress.update(stats.lines, stats.train_tokens + stats.heldout_tokens)

    def chunks(self) -> list[ChunkSummary]:
        return [self.summaries[i] for i in range(len(self.summaries))]


def _count(run: _ShardRun, progress: Progress) -> tuple[list[ChunkSummary], TokenCounts, dict, list]:
    """The counting pass: chunk summaries (in order), training token counts, chunk index ->
    ObjectRef of the tokenized chunk for the chunks that were kept, and (deduplicating) every
    chunk's keys' ObjectRef in chunk order."""
    counted = _Counted(progress)
    keys: list = []
    window = TaskWindow(run.window, counted.absorb)
    try:
        for chunk in iter_chunks(run.paths, run.settings.reading):
            result_ref, sentences_ref, keys_ref = count_task.remote(chunk, run.settings)
            keys.append(keys_ref)
            window.add(result_ref, tag=sentences_ref)
        window.drain()
    except ReservedWordError as err:  # the task knew the chunk's input by its number
        raise err.in_file(run.paths[err.source]) from None
    return counted.chunks(), counted.counts, counted.kept, keys if run.settings.dedup else []


def _deduplicate(
    run: _ShardRun,
    chunks: list[ChunkSummary],
    counts: TokenCounts,
    keys: list,
    kept: dict,
    progress: Progress,
):
    """The deduplicating pass: one task per hash range finds the later copies in its range, then
    one task per chunk removes its own and says which training counts to take off ``counts``.
    -> what :func:`_count` returns, of the kept sentences."""
    total = sum(c.stats.train_sentences + c.stats.heldout_sentences for c in chunks)
    ranges = hash_ranges(total, _cluster_workers(run.config.workers))
    found, touched = zip(*(find_task.remote([list(keys)], lo, hi) for lo, hi in ranges), strict=True)
    keys.clear()  # the find tasks hold the refs now: the keys are freed as they finish
    touched = {int(i) for part in get(list(touched)) for i in part}  # at most one int per chunk
    counted = _Counted(progress, counts)
    for index in sorted(set(range(len(chunks))) - touched):  # no copy in it: as the counting pass left it
        sentences_ref = kept.pop(index, None)
        counted.absorb(sentences_ref, (chunks[index], None, sentences_ref is not None))
    window = TaskWindow(run.window, counted.absorb)
    found = list(found)
    for index, source in chunk_sources(run.paths, run.settings.reading, chunks, touched, kept):
        chunk = chunks[index]
        job = DedupJob(run.settings, run.output, [found], index, chunk.source, chunk.stats)
        result_ref, sentences_ref = dedup_task.remote(source, job)
        del source
        window.add(result_ref, tag=sentences_ref)
    window.drain()
    return counted.chunks(), counted.counts, counted.kept


def _check_counts(total: LineStats, config: ShardConfig) -> None:
    if total.train_sentences + total.heldout_sentences == 0:
        raise ShardError(
            f"empty corpus: no sentences in the inputs ({total.lines} lines read, {total.empty} empty, "
            f"{total.overlong} longer than max_line_bytes={config.max_line_bytes})"
        )
    if total.train_sentences == 0:
        raise ShardError(f"no training sentences: all {total.heldout_sentences} sentences are held out")
    if total.max_sentence_tokens > config.shard_tokens:
        raise ShardError(
            f"a sentence has {total.max_sentence_tokens} tokens, more than shard_tokens={config.shard_tokens}; "
            "raise shard_tokens or lower max_line_bytes"
        )


def _shard_keys(layouts: dict[str, SplitLayout], chunk_index: int) -> list[tuple[str, int]]:
    return [(split, s) for split in SPLITS for s in layouts[split].chunk_shards[chunk_index]]


def _reusable_shards(
    run: _ShardRun, layouts, manifest: ShardManifest | None, out: ShardOutput
) -> dict[tuple[str, int], ShardRecord]:
    """Shards an interrupted run with this identity already wrote (read back and described).

    Only reached when the output's plan or manifest has this run's identity, and the content of
    every shard is fixed by the identity, so a file under a shard's final name (written
    atomically) is that shard; where an old manifest recorded its sha256, it must also match."""
    present = set(storage.list_prefix(output_prefix(run.output)))
    old = {
        (split, e.name): e.sha256 for split in SPLITS for e in (manifest.shards[split] if manifest else ())
    }
    found: dict[tuple[str, int], ShardRecord] = {}

    def keep(tag, record: ShardRecord | None):
        if record is not None and old.get((tag[0], record.name), record.sha256) == record.sha256:
            found[tag] = record

    window = TaskWindow(run.window, keep)
    for split in SPLITS:
        for shard in range(layouts[split].num_shards):
            name = shard_name(split, shard)
            path = storage.join(run.output, name)
            if path in present:
                window.add(describe_task.remote(path, name, out.unk_id, out.unigram_box), tag=(split, shard))
    window.drain()
    return found


def _write(run: _ShardRun, out: ShardOutput, counted: _Vocabulary, layouts, done, progress: Progress):
    """The writing pass; returns the records of the shards it wrote. ``counted.kept`` (chunk index
    -> ObjectRef of the counting pass's tokenized chunk) is emptied as they are used."""
    chunks, vocab, kept = counted.chunks, counted.vocab, counted.kept
    needed = {(split, s) for split in SPLITS for s in range(layouts[split].num_shards)} - set(done)
    feeders = {
        (split, shard): chunk_list
        for split in SPLITS
        for shard, chunk_list in enumerate(layouts[split].shard_chunks())
    }
    vocab_box = [ray.put(vocab.tokens)]  # boxed: tasks fetch it only when their index cache misses
    written: dict[tuple[str, int], ShardRecord] = {}

    def finished(_, records: dict[tuple[str, int], ShardRecord]):
        written.update(records)
        for record in records.values():
            progress.update(record.sentences, record.tokens)

    window = TaskWindow(run.window, finished)
    pending: dict[tuple[str, int], list] = {}
    feeding = {i for i in range(len(chunks)) if any(key in needed for key in _shard_keys(layouts, i))}
    for index, source in chunk_sources(run.paths, run.settings.reading, chunks, feeding, kept):
        keys = [key for key in _shard_keys(layouts, index) if key in needed]
        own = [key for key in keys if feeders[key] == [index]]
        shared = [key for key in keys if key not in own]
        job = EncodeJob(
            settings=run.settings,
            vocab_box=vocab_box,
            vocab_sha=vocab.sha256,
            shard_tokens=run.config.shard_tokens,
            out=out,
            index=index,
            offsets={split: layouts[split].offsets[index] for split in SPLITS},
            shards={split: layouts[split].chunk_shards[index] for split in SPLITS},
            expected=chunks[index].stats,
            own=own,
            shared=shared,
        )
        refs = encode_task.options(num_returns=1 + len(shared)).remote(source, job)
        del source  # the task holds the tokenized chunk now; freed when it finishes
        refs = refs if isinstance(refs, list) else [refs]
        window.add(refs[0], tag=index)
        for key, ref in zip(shared, refs[1:], strict=True):
            pending.setdefault(key, []).append(ref)
            if feeders[key][-1] == index:  # the shard's last chunk: its pieces are all submitted
                window.add(write_task.remote(out, key, *pending.pop(key)), tag=key)
    window.drain()
    if pending or set(written) != needed:
        raise ShardError(
            f"input changed during the run: shards {sorted(needed - set(written))[:3]} got no sentences"
        )
    return written


def _cluster_workers(requested: int) -> int:
    return requested or max(1, int(ray.cluster_resources().get("CPU", 1)))


@dataclass(frozen=True)
class ShardDetails:
    """What a shard run did beyond the counts every stage gives."""

    manifest: ShardManifest
    """The output's manifest (also of a no-op rerun, which processed 0 tokens)."""
    reused: int = 0
    """Shards an earlier run of the same output wrote."""
    baseline_seconds: float = 0.0
    """The Kneser-Ney pass's share of the run's seconds."""
    dedup_seconds: float | None = None
    """The deduplicating pass's seconds; None where it did not run (a rerun from the plan)."""


def run_shard(cfg: ShardConfig, session: RaySession | None = None) -> StageResult[ShardDetails]:
    """The shard stage's work for a resolved ShardConfig in the entry point's Ray ``session``
    (started only when there is work; default: the Ray this process initialised); its dashboard
    and closing lines are ``pipeline/shard/stage.py``'s.

    A run that fails before writing anything (an empty corpus, an unreadable input) leaves no
    folder it created; one that wrote something keeps it, for a rerun to complete."""
    with taken_back_on_failure(cfg.output, OWN_FILES):
        return _run_shard(cfg, session or RaySession.joined())


def _run_shard(config: ShardConfig, session: RaySession) -> StageResult[ShardDetails]:
    started = time.perf_counter()
    output = config.output
    inputs = resolve_inputs(config.input, "input")
    heldout = resolve_inputs(config.heldout_input, "heldout_input")
    if both := set(inputs) & set(heldout):
        raise ShardError(f"{sorted(both)[0]} is both an input and a heldout_input")
    paths = inputs + heldout
    try:
        versions = {path: storage.version(path) for path in paths}
    except storage.StorageError as err:
        raise ShardError(f"cannot read input: {err}") from None
    identity = run_identity(to_dict(config), inputs, heldout, versions)
    lease = Lease(output, ShardError, "output")
    lease.check()  # a run still writing this folder: refused, whatever its files say so far
    manifest, _ = inspect_output(output, identity)
    if manifest is not None and is_complete(manifest):
        return StageResult("shard", output, time.perf_counter() - started, 0, ShardDetails(manifest))
    _check_writable(output)
    # one run writes a folder at a time; what it finds is looked at again once it holds the lease
    with lease:
        claim_output(output, identity)  # unless a run claimed it first: then its identity is checked
        manifest, plan = inspect_output(output, identity)
        session.start()
        run = _ShardRun(
            paths, output, config, _settings(config, len(inputs)), 2 * _cluster_workers(config.workers)
        )
        counted = _planned(run, identity, plan) or _count_and_plan(run, identity)
        layouts = _layouts(counted.chunks, config.shard_tokens)
        out = ShardOutput(
            output,
            config.seed,
            config.block_tokens,
            UNK_ID,
            [ray.put(_unigram(counted.chunks, counted.vocab))],
        )
        done = _reusable_shards(run, layouts, manifest, out)
        progress = Progress("shard: writing", config.progress)
        written = _write(run, out, counted, layouts, done, progress)
        progress.close()
        records = {**done, **written}
        shards = {split: [records[(split, s)] for s in range(layouts[split].num_shards)] for split in SPLITS}
        baselines, baseline_seconds = _baselines(run, shards, counted.vocab)
        record = build_manifest(
            identity, paths, len(inputs), counted.chunks, counted.vocab, counted.distinct, shards, baselines
        )
        manifest = ShardManifest.of(record, output)
        total_tokens = sum(layouts[s].total_tokens for s in SPLITS)
        if sum(manifest.totals[s].tokens for s in SPLITS) != total_tokens:
            raise ShardError(
                f"shards in {output} do not add up to the counted tokens; delete the output and rerun"
            )
        lease.verify()  # still this run's folder (not taken over while it was stopped): then commit
        storage.write_bytes(storage.join(output, MANIFEST_FILE), encode_json(record))
        seconds = time.perf_counter() - started
        details = ShardDetails(manifest, len(done), baseline_seconds, counted.dedup_seconds)
        return StageResult("shard", output, seconds, total_tokens, details)


@dataclass
class _Vocabulary:
    """What the counting passes leave for the writing pass: the chunk summaries in order, the
    vocabulary and its count of distinct training tokens, ``kept`` (chunk index -> ObjectRef of its
    tokenized chunk; none on a rerun from the plan) and the deduplicating pass's seconds (None when
    it did not run)."""

    chunks: list[ChunkSummary]
    vocab: Vocabulary
    distinct: int
    kept: dict = field(default_factory=dict)
    dedup_seconds: float | None = None


def _planned(run: _ShardRun, identity: dict, plan: dict | None) -> _Vocabulary | None:
    """An interrupted run's counting result, from its plan and vocabulary files, when it is this
    run's; None when the counting passes must run."""
    chunks = plan_chunks(plan, identity, run.config.chunk_bytes) if plan else None
    if chunks is None:
        return None
    vocab = read_vocabulary(run.output, plan["vocab_sha256"])
    return None if vocab is None else _Vocabulary(chunks, vocab, plan.get("distinct_train_tokens", 0))


def _count_and_plan(run: _ShardRun, identity: dict) -> _Vocabulary:
    """The counting pass, then (``dedup``) the deduplicating pass; the vocabulary built from their
    counts and written with the plan, which a rerun reuses."""
    config, output = run.config, run.output
    progress = Progress("shard: counting", config.progress)
    chunks, counts, kept, keys = _count(run, progress)
    progress.close()
    dedup_seconds = None
    if config.dedup:
        dedup_started = time.perf_counter()
        progress = Progress("shard: removing duplicates", config.progress)
        chunks, counts, kept = _deduplicate(run, chunks, counts, keys, kept, progress)
        progress.close()
        dedup_seconds = time.perf_counter() - dedup_started
    total = LineStats()
    for chunk in chunks:
        total.add(chunk.stats)
    _check_counts(total, config)
    vocab = build_vocabulary(counts, total.train_sentences, config.min_count, config.max_size)
    distinct = counts.present()
    del counts
    storage.write_bytes(storage.join(output, VOCAB_FILE), vocab.vocab_bytes)
    storage.write_bytes(storage.join(output, COUNTS_FILE), vocab.counts_bytes)
    plan = {**build_plan(identity, config.chunk_bytes, chunks, vocab), "distinct_train_tokens": distinct}
    storage.write_bytes(storage.join(output, PLAN_FILE), encode_json(plan))
    return _Vocabulary(chunks, vocab, distinct, kept, dedup_seconds)


def _baselines(run: _ShardRun, shards, vocab: Vocabulary) -> tuple[dict, float]:
    """The manifest's ``baselines`` (the Kneser-Ney model of each of ``kneser_ney_orders``, in
    ascending order, unless none is asked for or nothing is held out) and the seconds their passes
    took. Each order is a pass of its own; only the highest writes the ARPA file."""
    orders = sorted(run.config.kneser_ney_orders)
    if not orders:
        return {}, 0.0
    started = time.perf_counter()
    train_tokens = sum(r.tokens for r in shards["train"])
    records = []
    for order in orders:
        plan = BaselinePlan(
            run.output,
            order,
            len(vocab.tokens),
            kneser_ney.parts_for(train_tokens, order),
            run.window,
            run.config.kneser_ney_arpa and order == orders[-1],
        )
        bars = BaselineBars(order, plan.parts, run.config.progress)
        try:
            record = kneser_ney_baseline(plan, shards, vocab.tokens, bars)
        finally:
            bars.close()
        if record is None:  # nothing held out: no order has a baseline
            return {}, time.perf_counter() - started
        records.append(record)
    return {"kneser_ney": records}, time.perf_counter() - started


def _unigram(chunks: Sequence[ChunkSummary], vocab: Vocabulary) -> np.ndarray:
    """The training unigram's log-probabilities, float64 ``(V,)``, from the counting pass."""
    total = LineStats()
    for chunk in chunks:
        total.add(chunk.stats)
    counts = np.asarray(vocab.counts, dtype=np.int64)
    return unigram_log_probs(training_target_counts(counts, total.train_sentences, total.train_tokens))


def _layouts(chunks: Sequence[ChunkSummary], shard_tokens: int) -> dict[str, SplitLayout]:
    longest = max((c.stats.max_sentence_tokens for c in chunks), default=0)
    return {split: layout_split([c.tokens(split) for c in chunks], shard_tokens, longest) for split in SPLITS}

"""The embed stage from a resolved EmbedConfig to a finished output: checks, plan, run, manifest.

Order matters for "fail fast, lose nothing": settings, model files (loaded once on the driver),
input and output (writable, and empty or this stage's own) are all checked before Ray starts; the
output is claimed (``_progress/run.json``) before the first shard, and ``manifest.json`` is written
only when every shard is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass

import ray
import torch
from tqdm import tqdm

from elmo_model.static_inference import OutputSpec
from pipeline.config import UseGPU, to_dict
from pipeline.embed import manifest
from pipeline.embed.config import EmbedConfig, Pool, PoolOver, StoredDType, is_single_file
from pipeline.embed.dataflow import ActorPool, embed_stream
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import chosen_format
from pipeline.embed.inputs import ShardSpec, plan_records, plan_shards, resolve_inputs
from pipeline.embed.pass_size import PassSize, gpu_free_bytes, pass_size, per_position
from pipeline.embed.record_inputs import RecordCounts
from pipeline.embed.resume import (
    OWN_FILES,
    check_output,
    check_writable,
    claim_output,
    complete_shards,
)
from pipeline.embed.settings import EmbedSettings, record_reading
from pipeline.embed.single_file import delete_parts, merge, parts_path
from pipeline.embed.startup import AfterFirstCommit, StartupClock
from pipeline.formats.tokenizer import TokenizerName, make_tokenizer
from pipeline.model_loader import ModelSource, load_bilm, resolve_model
from pipeline.output_folder import Claim, taken_back_on_failure
from pipeline.runtime import cluster_capacity, ray_runtime
from pipeline.runtime.ray_runtime import RaySession
from pipeline.stage import StageResult
from pipeline.tracking.config import WandbConfig, WandbMode
from pipeline.tracking.stage_run import StageRun


def run_settings(cfg, kind: str, paths: list[str], model_sha256: str) -> dict:
    """The settings that decide the vectors; a rerun into the same output must repeat them."""
    return {
        "schema": manifest.SCHEMA,
        "input_kind": kind,
        "input": list(paths),
        "shard_splits": list(cfg.shard_splits) if kind == "shards" else [],
        "model_sha256": model_sha256,
        "layers": cfg.layers.value,
        "dtype": cfg.dtype.value,
        "precision": cfg.precision.value,
        "pool": cfg.pool.value,
        "layout": cfg.layout.value,
        "file_format": cfg.format.value,
        "stateful": cfg.stateful,
        "stateful_batch_size": cfg.stateful_batch_size if cfg.stateful else 0,
        "lines_per_shard": cfg.lines_per_shard,
        "max_sentence_tokens": cfg.max_sentence_tokens,
        "long_sentences": cfg.long_sentences.value,
        "invalid_utf8": cfg.invalid_utf8.value,
        # a record corpus's reading decides its sentences (text runs leave it out: their claims stay as they were)
        **({"records": dataclasses.asdict(record_reading(cfg))} if kind == "records" else {}),
        **({"pool_over": cfg.pool_over.value} if cfg.pool_over is PoolOver.record else {}),
        **({"tokenizer": f"moses:{cfg.moses_lang}"} if cfg.tokenizer is TokenizerName.moses else {}),
    }


def gpus_per_worker(use_gpu: UseGPU, share: float, embedded: bool) -> float:
    """``share`` when actors should take GPUs (``auto``: the cluster has one, or its autoscaler can
    add one), else 0."""
    if use_gpu is UseGPU.false:
        return 0.0
    available = cluster_capacity.gpus_to_be_had(embedded)
    if use_gpu is UseGPU.true and not available and embedded:
        raise EmbedError("use_gpu=true but the Ray cluster has no GPU; set use_gpu=auto or false")
    return share if use_gpu is UseGPU.true or available else 0.0


def check_capacity(cfg, workers: int, gpus: float, embedded: bool) -> None:
    """The pool's resources, asked of an autoscaling cluster (``pipeline.runtime.cluster_capacity``);
    refused at once on an embedded cluster too small for it, which never grows."""
    bundle = {"CPU": cfg.cpus_per_worker, **({"GPU": gpus} if gpus else {})}
    hint = "lower workers or " + ("gpu_share" if gpus else "cpus_per_worker (or set num_cpus)")
    need = cluster_capacity.Need((bundle,) * workers, f"workers={workers} actors", hint)
    try:
        cluster_capacity.secure(need, embedded, cfg.resources_timeout_s)
    except cluster_capacity.CapacityError as err:
        raise EmbedError(str(err)) from None


READERS_PER_ACTOR = 8
"""Default cap on preparing tasks per model actor (``readers=0``)."""


def default_readers(cluster_cpus: float, workers: int, cpus_per_worker: float) -> int:
    """The CPUs ``workers`` actors leave of ``cluster_cpus``, at least 1, at most
    ``READERS_PER_ACTOR`` per actor."""
    free = int(cluster_cpus - workers * cpus_per_worker)
    return max(1, min(free, READERS_PER_ACTOR * workers))


def actor_pool(cfg, gpus: float) -> ActorPool:
    """The actors and readers of a run on the connected cluster (``readers=0``: the CPUs the
    actors leave free now, at least 1 and at most ``READERS_PER_ACTOR`` per actor: the tasks
    reserve no CPU, so a large cluster's count would start that many processes)."""
    workers = 1 if cfg.stateful else cfg.workers
    readers = cfg.readers or default_readers(
        ray.cluster_resources().get("CPU", 0), workers, cfg.cpus_per_worker
    )
    return ActorPool(workers, cfg.cpus_per_worker, gpus, readers, restartable=not ray_runtime.embedded())


def settings_for(cfg, device: str, size: PassSize | None = None) -> EmbedSettings:
    """The actors' settings; ``size``: the pass size chosen for the device (default: the
    configured one, or the CPU's)."""
    size = size or pass_size(cfg.batch_tokens, cfg.max_batch_sentences, "cpu")
    return EmbedSettings(cfg, size.tokens, size.rows, threads=max(1, int(cfg.cpus_per_worker)), device=device)


def choose_pass_size(cfg, source: ModelSource, gpus: float) -> PassSize:
    """``batch_tokens`` / ``max_batch_sentences`` as set, or chosen for the actors' device: on GPUs
    from the free memory of one (asked only when ``batch_tokens`` is 0)."""
    if not gpus or cfg.stateful:
        return pass_size(cfg.batch_tokens, cfg.max_batch_sentences, "cpu")
    if cfg.batch_tokens:
        return pass_size(cfg.batch_tokens, cfg.max_batch_sentences, "cuda")
    dtype = torch.float16 if cfg.dtype is StoredDType.float16 else torch.float32
    output = OutputSpec(cfg.layers.value, pool=cfg.pool is Pool.mean, dtype=dtype)
    position = per_position(source, cfg.precision.value, output)
    return pass_size(0, cfg.max_batch_sentences, "cuda", gpu_free_bytes(gpus), position)


@dataclass(frozen=True)
class EmbedDetails:
    """What an embed run did beyond the counts every stage gives."""

    shards: int
    """The output's shards, done before or now."""
    new_shards: int
    """Shards this run committed."""
    totals: dict
    """The output's totals so far (``manifest.totals``: sentences, tokens, what was repaired)."""
    model: ModelSource
    """The model read."""
    input_kind: str
    """``text`` or ``shards``."""
    input_paths: tuple[str, ...]
    """The input's resolved paths (a shard directory: itself)."""
    startup: dict[str, float]
    """Where the start-up went (`StartupClock.startup`); empty where no shard was committed."""
    after_first_commit: AfterFirstCommit | None
    """The run's pace after its first commit; None where no shard was committed."""
    manifest: dict | None = None
    """The output's manifest, once the output is complete."""
    records: RecordCounts | None = None
    """A record corpus's records read and skipped (None: text input)."""


def run_embed(
    cfg: EmbedConfig, session: RaySession | None = None, tracking: StageRun | None = None
) -> StageResult[EmbedDetails]:
    """The embed stage's work: embed ``cfg.input`` into ``cfg.output``; resumes a run killed
    earlier with the same settings. Ray: the entry point's ``session``, started only when a shard
    is left to embed (default: the Ray this process initialised). ``tracking``: the stage's wandb
    run, a row per committed shard (none: no rows); its dashboard and closing lines are
    ``pipeline/embed/stage.py``'s.

    An output that is not this stage's own is refused before anything is written; a run that fails
    before committing a shard leaves the output as it found it (no claim, no new folder)."""
    clock = StartupClock(time.monotonic())
    single = is_single_file(cfg.output)
    target = parts_path(cfg.output) if single else cfg.output
    source = resolve_model(cfg.model, cfg.options_file, cfg.weights_file, EmbedError)
    load_bilm(source, EmbedError)  # a broken weights file fails here, in one line, not inside an actor
    kind, paths = resolve_inputs(cfg.input)
    if kind != "records" and cfg.pool_over is PoolOver.record:
        raise EmbedError(
            "pool_over=record pools the sentences of a record; the input is sentence-per-line text "
            "(a record corpus is Parquet or JSON Lines): use pool_over=sentence"
        )
    if kind == "records" and single:
        raise EmbedError(
            f"output {cfg.output}: records keep their ids in a folder output (a single AllenNLP file has "
            "no room for them): use a folder output"
        )
    check_output(cfg.output, target, single, cfg.overwrite)
    tracking = tracking or StageRun(WandbConfig(mode=WandbMode.disabled), cfg.output, "embed", {})
    job = _EmbedJob(cfg, single, target, source, kind, paths, session or RaySession.joined(), tracking, clock)
    # the claim is the run's once it wrote run.json (a resumed run's is an earlier run's)
    with taken_back_on_failure(target, OWN_FILES, claimed=False) as claim:
        return _run(job, claim)


@dataclass(frozen=True)
class _EmbedJob:
    """What ``run_embed`` resolved before touching the output: ``target`` is where the shards go
    (the output, or the parts folder of a ``single`` file); ``kind``/``paths`` the resolved input."""

    cfg: EmbedConfig
    single: bool
    target: str
    source: ModelSource
    kind: str
    paths: list[str]
    session: RaySession
    tracking: StageRun
    """The stage's wandb run: a row per committed shard as it goes (started by the first)."""
    clock: StartupClock
    """Where the start-up goes (startup.py)."""


def _run(job: _EmbedJob, claim: Claim) -> StageResult[EmbedDetails]:
    run = _EmbedRun(job)
    todo = run.plan(claim)
    start = time.monotonic()
    stopped = run.embed(todo, start)
    result = run.result(time.monotonic() - start, stopped)
    return result if stopped else run.finish(result)


class _EmbedRun:
    """One run over a resolved job, in the order it goes: ``plan`` (the shards, what an earlier run
    finished, the claim), ``embed`` (the shards left, through the actor pool, each committed as it
    comes), ``result``, and for a run that was not stopped early ``finish`` (the manifest, and the
    single file of single-file mode)."""

    def __init__(self, job: _EmbedJob):
        self.job, self.cfg = job, job.cfg
        self.specs: list[ShardSpec] = []
        self.settings: dict = {}
        """``run.json``'s settings: what decides the vectors."""
        self.done: dict[int, dict] = {}
        """Committed shards' entries by index, an earlier run's and this one's."""
        self.new_shards = self.new_tokens = 0
        self.records: RecordCounts | None = None
        """A record corpus's records read and skipped (None: text input)."""

    def plan(self, claim: Claim) -> list[tuple[ShardSpec, bool]]:
        """Claim the output (or find an earlier run's claim and its finished shards); the shards to
        go through, each with whether to write it (a stateful run reads its done shards again for
        the state they carry)."""
        job, cfg = self.job, self.cfg
        check_writable(job.target)
        if job.kind == "records":
            job.session.start()  # the records are counted by Ray tasks
            plan = plan_records(job.paths, cfg.lines_per_shard, record_reading(cfg))
            self.specs, self.records = plan.specs, plan.counts
        else:
            self.specs = plan_shards(job.kind, job.paths, cfg.lines_per_shard, cfg.shard_splits)
        self.settings = run_settings(cfg, job.kind, job.paths, job.source.sha256)
        resumed = claim_output(job.target, self.settings)
        claim.claimed = not resumed
        fmt = chosen_format(cfg.format.value, cfg.layout.value)
        self.done = complete_shards(job.target, self.specs, cfg.verify_resume, fmt) if resumed else {}
        if cfg.stateful and len(self.done) < len(self.specs):
            return [(spec, spec.index not in self.done) for spec in self.specs]
        return [(spec, True) for spec in self.specs if spec.index not in self.done]

    def embed(self, todo: list[tuple[ShardSpec, bool]], start: float) -> bool:
        """Embed ``todo``, committing each shard as it comes; whether the run stopped early
        (``stop_after_shards``)."""
        cfg, job = self.cfg, self.job
        bar = tqdm(
            total=sum(s.num_lines for s in self.specs),
            initial=sum(e["sentences"] for e in self.done.values()),
            unit="sent",
            desc="embed",
            disable=not cfg.progress,
            file=sys.stderr,
        )
        with bar:
            job.clock.mark("checks")
            settings, pool = self._actors(todo)
            job.clock.mark("ray")
            # closed however the loop ends (a stop asked, an error, Ctrl-C or SIGTERM raised in the body):
            # Ray Data's executor threads stop before Ray does (docs/reliability.md#stopping)
            with contextlib.closing(embed_stream(todo, job.source, settings, job.target, pool)) as stream:
                for result in stream:
                    if result["written"] and self._committed(result["entry"], bar, start):
                        return True
        return False

    def _actors(self, todo: list[tuple[ShardSpec, bool]]) -> tuple[EmbedSettings, ActorPool | None]:
        """Ray started (when there is work), the cluster checked, the actors' settings and pool."""
        cfg = self.cfg
        if todo:
            self.job.session.start()
        embedded = ray_runtime.embedded()
        gpus = gpus_per_worker(cfg.use_gpu, cfg.gpu_share, embedded) if todo else 0.0
        if todo:
            check_capacity(cfg, 1 if cfg.stateful else cfg.workers, gpus, embedded)
        settings = settings_for(cfg, "cuda" if gpus else "cpu", choose_pass_size(cfg, self.job.source, gpus))
        return settings, actor_pool(cfg, gpus) if todo else None

    def _committed(self, entry: dict, bar: tqdm, start: float) -> bool:
        """Count a committed shard (the bar, the dashboard's row); whether the run stops here."""
        self.job.clock.committed(entry)  # takes an actor's start-up report off the entry
        self.done[entry["index"]] = entry
        self.new_shards += 1
        self.new_tokens += entry["tokens"]
        bar.update(entry["sentences"])
        rate = self.new_tokens / max(time.monotonic() - start, 1e-9)
        bar.set_postfix_str(f"{rate:,.0f} tok/s")
        self.job.tracking.log(
            {"shards_done": len(self.done), "run/tokens": self.new_tokens, "run/tokens_per_s": rate}
        )
        stop_after = self.cfg.stop_after_shards
        return bool(stop_after) and self.new_shards >= stop_after and len(self.done) < len(self.specs)

    def result(self, seconds: float, stopped: bool) -> StageResult[EmbedDetails]:
        job = self.job
        details = EmbedDetails(
            len(self.specs),
            self.new_shards,
            manifest.totals(list(self.done.values())),
            job.source,
            job.kind,
            tuple(job.paths),
            job.clock.startup(),
            job.clock.after_first_commit(self.new_tokens),
            records=self.records,
        )
        return StageResult("embed", self.cfg.output, seconds, self.new_tokens, details, complete=not stopped)

    def finish(self, result: StageResult[EmbedDetails]) -> StageResult[EmbedDetails]:
        """Every shard done: the manifest (the output complete), then single-file mode's file."""
        cfg, job = self.cfg, self.job
        missing = sorted(set(range(len(self.specs))) - set(self.done))
        if missing:
            raise EmbedError(f"output {job.target}: shards {missing[:5]} were not written; rerun to finish")
        entries = [self.done[i] for i in sorted(self.done)]
        records = self.records.to_dict() if self.records else None
        document = manifest.build_manifest(
            self.settings, job.source.to_dict(), entries, to_dict(cfg), records
        )
        manifest.write_json(manifest.manifest_path(job.target), document)
        result.details = dataclasses.replace(result.details, manifest=document)
        if job.single:
            merge(
                job.target,
                self.specs,
                cfg.output,
                max_tokens=cfg.max_sentence_tokens,
                long_sentences=cfg.long_sentences.value,
                invalid_utf8=cfg.invalid_utf8.value,
                tokenize=make_tokenizer(cfg.tokenizer.value, cfg.moses_lang),
            )
            if not cfg.keep_parts:
                delete_parts(job.target)
        return result

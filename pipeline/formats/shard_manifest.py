"""A shard directory's ``manifest.json``, typed: parsed and checked once, then read by attribute.

The shard stage writes the manifest last (``pipeline/shard/manifest.py`` builds it); train, embed,
the dashboards and the benchmarks read it through :class:`ShardManifest`, so no module outside
``formats/`` knows its JSON keys. The fields other stages rely on are listed in
``docs/architecture.md`` ("Shard output format"); a manifest is untrusted input, so every field a
reader uses is checked here (types, plain file names, sha256s, counts) before anything is planned
from it, and a bad one is a :class:`FormatError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.formats.shard_format import (
    KNESER_NEY_MAX_ORDER,
    MANIFEST_FILE,
    PLAIN_NAME,
    SHA256_HEX,
    SPLITS,
    FormatError,
    check_split,
    read_shard_vocab,
)
from pipeline.runtime import storage

FORMAT_VERSION = 2
"""The manifest's ``format_version``. 2: ``baselines.kneser_ney`` is a list of models (one per
``kneser_ney_orders``), and the line record and each held-out shard's ``unigram_nll`` are always
there. 1 held one model; a manifest of 1 or of no version (an older shard stage) may lack the
line record and the held-out shards' ``unigram_nll``, which are then read as absent."""
MIN_SENTENCE_BYTES = 10
"""A sentence costs a shard at least this many bytes: a 4-byte length, a 4-byte id per token (at
least one) and its text with a newline (at least 2 bytes). A manifest that claims more sentences
than its shard's size allows is refused before anything is planned from it."""


@dataclass(frozen=True)
class ShardEntry:
    """One shard file of a split: its plain ``{split}-NNNNNN.tar`` name, counts and sha256.
    ``unigram_nll``: held-out shards of a current shard stage only, the summed ``-log p`` of their
    forward targets under the training unigram (``pipeline.formats.unigram``)."""

    name: str
    sentences: int
    tokens: int
    sha256: str
    unigram_nll: float | None = None


@dataclass(frozen=True)
class SplitTotals:
    """One split's totals over its shards."""

    sentences: int
    tokens: int
    unk_tokens: int
    shards: int
    blocks: int | None = None
    bytes: int | None = None

    @property
    def unk_rate(self) -> float:
        """The share of the split's tokens that are ``<UNK>`` (0 when empty)."""
        return self.unk_tokens / max(1, self.tokens)

    @property
    def targets(self) -> int:
        """Predictions a direction makes over the split: every token and each sentence's boundary."""
        return self.tokens + self.sentences


@dataclass(frozen=True)
class VocabRecord:
    """The vocabulary files (plain names in the directory), size and ``vocab.txt``'s sha256."""

    file: str
    counts_file: str
    size: int
    sha256: str
    distinct_train_tokens: int | None = None


@dataclass(frozen=True)
class ArpaFile:
    """The ARPA file of a Kneser-Ney model (a plain name in the directory), its size and sha256."""

    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class KneserNeyModel:
    """A Kneser-Ney baseline the shard stage counted: order, held-out perplexity over ``targets``,
    and the ARPA file it wrote, if asked to."""

    order: int
    perplexity: float
    targets: int
    arpa: ArpaFile | None = None


@dataclass(frozen=True)
class LineCounts:
    """How the corpus's lines (or a record corpus's sentences) were accounted for; a manifest of an
    older shard stage has none. ``duplicates``: split -> (sentences, tokens) removed;
    ``first_skipped``: (input path, record number) of the first record skipped, if any."""

    read: int
    skipped: Mapping[str, int]
    invalid_utf8_replaced: int
    control_chars_replaced: int
    duplicates: Mapping[str, tuple[int, int]]
    documents: int | None = None
    records_skipped: int = 0
    first_skipped: tuple[str, int] | None = None


@dataclass(frozen=True)
class ShardSettings:
    """The shard stage's settings that readers explain themselves with (the rest of the run's
    identity stays in the JSON). None where the run did not record one."""

    heldout_fraction: float | None = None
    min_count: int | None = None
    max_size: int | None = None
    dedup: bool = False
    split_sentences: bool | None = None
    text_field: str = "text"
    kneser_ney_arpa: bool = False


@dataclass(frozen=True)
class ShardManifest:
    """A shard directory's manifest, checked. ``folder``: the directory (local or ``s3://``) its
    files are joined to; ``listing_sha256``: one sha256 over the shard lists as written (every
    field of every entry), what a training run records as its data."""

    folder: str
    shards: Mapping[str, tuple[ShardEntry, ...]]
    totals: Mapping[str, SplitTotals]
    vocab: VocabRecord
    kneser_ney: tuple[KneserNeyModel, ...]
    settings: ShardSettings
    lines: LineCounts | None
    listing_sha256: str

    @property
    def path(self) -> str:
        return manifest_path(self.folder)

    @property
    def vocab_path(self) -> str:
        return storage.join(self.folder, self.vocab.file)

    @property
    def counts_path(self) -> str:
        return storage.join(self.folder, self.vocab.counts_file)

    def urls(self, split: str) -> list[str]:
        """Full paths of the shards of ``split``, in order."""
        check_split(split)
        return [storage.join(self.folder, entry.name) for entry in self.shards[split]]

    def read_vocab(self) -> tuple[bytes, list[str]]:
        """The vocabulary's bytes, checked against the manifest's sha256, and its tokens."""
        return read_shard_vocab(self.vocab_path, self.vocab.sha256)

    def files(self) -> list[str]:
        """Every file name the manifest lists: the vocabulary files, then each split's shards."""
        return [self.vocab.file, self.vocab.counts_file] + [e.name for s in SPLITS for e in self.shards[s]]

    @property
    def unigram_perplexity(self) -> float | None:
        """The held-out baseline from the ``unigram_nll`` of the held-out shard entries; None when
        an entry lacks it (a manifest of an older shard stage) or nothing is held out."""
        entries = self.shards["heldout"]
        if not entries or any(e.unigram_nll is None for e in entries):
            return None
        targets = sum(e.tokens + e.sentences for e in entries)
        return float(np.exp(sum(e.unigram_nll for e in entries) / targets))

    def unlearnable_unk(self) -> str | None:
        """The warning for shards whose ``<UNK>`` the biLM cannot learn: none of the training tokens
        is ``<UNK>`` while some held-out ones are, so held-out words outside the vocabulary are
        scored by a softmax row no training target ever raised (docs/training.md#the-vocabulary).
        None otherwise."""
        train, heldout = self.totals["train"], self.totals["heldout"]
        if train.unk_tokens or not heldout.unk_tokens:
            return None
        rule = self.settings
        setting = ", ".join(
            f"{name}={value}"
            for name, value in (("min_count", rule.min_count), ("max_size", rule.max_size))
            if value is not None
        )
        return (
            f"warning: the training split has no <UNK> while {heldout.unk_tokens:,} of {heldout.tokens:,} "
            f"held-out tokens ({heldout.unk_rate:.1%}) are <UNK>, so the biLM scores "
            f"them by a softmax row it never trained ({setting or 'the vocabulary'}); shard with min_count=3 "
            "(the default) to leave rare words to <UNK>"
        )

    def check_listed_shards(self, splits: Sequence[str] = SPLITS) -> None:
        """Every shard of ``splits`` is in the directory and large enough for the sentences it
        claims (``MIN_SENTENCE_BYTES``): one listing of the directory (a few requests on S3 however
        many shards), no shard's bytes read. FormatError naming the first that is not."""
        prefix = self.folder.rstrip("/") + "/"
        sizes = {path[len(prefix) :]: size for path, size in storage.list_sizes(prefix).items()}
        for split in splits:
            for entry in self.shards[split]:
                path = storage.join(self.folder, entry.name)
                if entry.name not in sizes:
                    raise FormatError(f"shard {path} is listed in {MANIFEST_FILE} but missing")
                if entry.sentences * MIN_SENTENCE_BYTES > sizes[entry.name]:
                    raise FormatError(
                        f"shard {path}: {MANIFEST_FILE} claims {entry.sentences:,} sentences, more than its "
                        f"{sizes[entry.name]:,} bytes can hold; the manifest is not this directory's"
                    )

    @classmethod
    def of(cls, record: Any, folder: str) -> ShardManifest:
        """The manifest of the JSON object ``record`` (as the shard stage builds or writes it) for
        the directory ``folder``, checked."""
        where = manifest_path(folder)
        if not isinstance(record, dict):
            raise FormatError(f"manifest {where}: expected a JSON object")
        shards, totals, vocab = (record.get(k) for k in ("shards", "totals", "vocab"))
        if not isinstance(shards, dict) or not isinstance(totals, dict) or not isinstance(vocab, dict):
            raise FormatError(f"manifest {where}: needs 'shards', 'totals' and 'vocab' objects")
        current = record.get("format_version") == FORMAT_VERSION  # an older one may lack some records
        entries = {split: _entries(shards.get(split), split, where, current) for split in SPLITS}
        listed = json.dumps(shards, sort_keys=True, separators=(",", ":")).encode()
        return cls(
            folder=folder,
            shards=entries,
            totals={split: _totals(totals.get(split), entries[split], split, where) for split in SPLITS},
            vocab=_vocab(vocab, where),
            kneser_ney=_kneser_ney(record, where),
            settings=_settings(record.get("config"), where),
            lines=_lines(record.get("lines"), record.get("inputs_detail"), where, current),
            listing_sha256=hashlib.sha256(listed).hexdigest(),
        )


def parse_manifest(data: bytes, folder: str) -> ShardManifest:
    """The manifest of directory ``folder`` from its ``manifest.json`` bytes, checked."""
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FormatError(f"manifest {manifest_path(folder)} is not valid JSON ({err})") from None
    return ShardManifest.of(record, folder)


def manifest_path(shard_dir: str) -> str:
    return storage.join(shard_dir, MANIFEST_FILE)


def read_manifest(shard_dir: str) -> ShardManifest:
    """The manifest of a shard directory (local or ``s3://`` prefix), checked.

    Raises FormatError when it is missing (the shard stage writes it last, so a missing manifest
    means the stage has not finished) or malformed.
    """
    path = manifest_path(shard_dir)
    if not storage.exists(path):
        raise FormatError(
            f"no {MANIFEST_FILE} in {shard_dir}: not a shard directory, or the shard stage did not finish"
        )
    return parse_manifest(storage.read_bytes(path), shard_dir)


def _typed(value: Any, kind: type) -> bool:
    """``value`` is a ``kind`` (an int is not a bool, nor a bool an int)."""
    if kind is bool or isinstance(value, bool):
        return type(value) is kind
    if kind is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, kind)


def _entries(listed: Any, split: str, where: str, current: bool) -> tuple[ShardEntry, ...]:
    if not isinstance(listed, list):
        raise FormatError(f"manifest {where}: shards.{split} must be a list")
    entries = []
    for i, entry in enumerate(listed):
        field = f"manifest {where}: shards.{split}[{i}]"
        for name, kind in (("name", str), ("sentences", int), ("tokens", int), ("sha256", str)):
            if not isinstance(entry, dict) or not _typed(entry.get(name), kind):
                raise FormatError(f"{field}.{name} missing or not {kind.__name__}")
        if not re.fullmatch(rf"{split}-\d{{6,}}\.tar", entry["name"]):
            raise FormatError(
                f"{field}.name {entry['name']!r} is not a {split}-NNNNNN.tar file of the directory"
            )
        if not SHA256_HEX.fullmatch(entry["sha256"]):
            raise FormatError(f"{field}.sha256 is not a sha256 (64 hex digits)")
        if not 0 <= entry["sentences"] <= entry["tokens"]:
            raise FormatError(f"{field}: sentences and tokens must be 0 <= sentences <= tokens")
        nll = entry.get("unigram_nll")
        if (nll is not None or (current and split == "heldout")) and not (_typed(nll, float) and nll >= 0):
            raise FormatError(f"{field}.unigram_nll missing or not a finite number >= 0")
        entries.append(ShardEntry(entry["name"], entry["sentences"], entry["tokens"], entry["sha256"], nll))
    return tuple(entries)


def _totals(total: Any, entries: tuple[ShardEntry, ...], split: str, where: str) -> SplitTotals:
    if not isinstance(total, dict) or not all(
        _typed(total.get(k), int) for k in ("sentences", "tokens", "unk_tokens")
    ):
        raise FormatError(f"manifest {where}: totals.{split}.sentences/tokens/unk_tokens missing or not int")
    if not 0 <= total["unk_tokens"] <= total["tokens"]:
        raise FormatError(f"manifest {where}: totals.{split}.unk_tokens must be in [0, tokens]")
    extra = {k: total.get(k) for k in ("blocks", "bytes")}
    if any(v is not None and not _typed(v, int) for v in extra.values()):
        raise FormatError(f"manifest {where}: totals.{split}.blocks/bytes not int")
    return SplitTotals(total["sentences"], total["tokens"], total["unk_tokens"], len(entries), **extra)


def _vocab(vocab: dict, where: str) -> VocabRecord:
    for name, kind in (("file", str), ("counts_file", str), ("size", int), ("sha256", str)):
        if not _typed(vocab.get(name), kind):
            raise FormatError(f"manifest {where}: vocab.{name} missing or not {kind.__name__}")
    for name in ("file", "counts_file"):
        if not PLAIN_NAME.fullmatch(vocab[name]):
            raise FormatError(
                f"manifest {where}: vocab.{name} {vocab[name]!r} is not a file of the directory"
            )
    if not SHA256_HEX.fullmatch(vocab["sha256"]):
        raise FormatError(f"manifest {where}: vocab.sha256 is not a sha256 (64 hex digits)")
    distinct = vocab.get("distinct_train_tokens")
    if distinct is not None and not _typed(distinct, int):
        raise FormatError(f"manifest {where}: vocab.distinct_train_tokens not int")
    return VocabRecord(vocab["file"], vocab["counts_file"], vocab["size"], vocab["sha256"], distinct)


def _kneser_ney(record: dict, where: str) -> tuple[KneserNeyModel, ...]:
    """The Kneser-Ney models of ``baselines``, ascending; none when the shard stage counted none
    (turned off, nothing held out, or a manifest from before the baseline). A manifest of format 1
    holds one model, later ones a list."""
    baselines = record.get("baselines", {})
    models = baselines.get("kneser_ney") if isinstance(baselines, dict) else "?"
    if models is None:
        return ()
    if record.get("format_version") == 1:
        models = [models]
    if not isinstance(models, list) or not all(_kneser_ney_ok(m) for m in models):
        raise FormatError(
            f"manifest {where}: baselines.kneser_ney needs, for each model, an order in "
            f"2..{KNESER_NEY_MAX_ORDER}, a finite perplexity >= 1, a positive count of targets and "
            "at most an ARPA file's name, bytes and sha256"
        )
    orders = [m["order"] for m in models]
    if orders != sorted(set(orders)):
        raise FormatError(
            f"manifest {where}: baselines.kneser_ney lists orders {orders}, not distinct ascending ones"
        )
    return tuple(
        KneserNeyModel(m["order"], float(m["perplexity"]), m["targets"], _arpa(m.get("arpa"))) for m in models
    )


def _arpa(record: dict | None) -> ArpaFile | None:
    return None if record is None else ArpaFile(record["file"], record["bytes"], record["sha256"])


def _kneser_ney_ok(model: Any) -> bool:
    if not isinstance(model, dict):
        return False
    order, ppl, targets, arpa = (model.get(k) for k in ("order", "perplexity", "targets", "arpa"))
    return (
        _typed(order, int)
        and 2 <= order <= KNESER_NEY_MAX_ORDER
        and _typed(ppl, float)
        and ppl >= 1.0
        and _typed(targets, int)
        and targets > 0
        and (arpa is None or _arpa_ok(arpa))
    )


def _arpa_ok(record: Any) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("file"), str)
        and PLAIN_NAME.fullmatch(record["file"]) is not None
        and _typed(record.get("bytes"), int)
        and isinstance(record.get("sha256"), str)
        and SHA256_HEX.fullmatch(record["sha256"]) is not None
    )


_SETTINGS = {
    "heldout_fraction": float,
    "min_count": int,
    "max_size": int,
    "dedup": bool,
    "split_sentences": bool,
    "text_field": str,
    "kneser_ney_arpa": bool,
}


def _settings(config: Any, where: str) -> ShardSettings:
    config = config if isinstance(config, dict) else {}
    found = {name: config[name] for name in _SETTINGS if config.get(name) is not None}
    for name, value in found.items():
        if not _typed(value, _SETTINGS[name]):
            raise FormatError(f"manifest {where}: config.{name} is not {_SETTINGS[name].__name__}")
    return ShardSettings(**found)


def _lines(lines: Any, inputs: Any, where: str, current: bool) -> LineCounts | None:
    if lines is None and not current:
        return None
    bad = FormatError(f"manifest {where}: lines is not the shard stage's line record")
    if not isinstance(lines, dict):
        raise bad
    counts = {"read": lines.get("read")} | {
        k: lines.get(k, 0) for k in ("invalid_utf8_replaced", "control_chars_replaced")
    }
    skipped, duplicates = lines.get("skipped"), lines.get("duplicates", {})
    if (
        not all(_typed(v, int) for v in counts.values())
        or not isinstance(skipped, dict)
        or not all(_typed(v, int) for v in skipped.values())
        or not isinstance(duplicates, dict)
    ):
        raise bad
    removed = {}
    for split, record in duplicates.items():
        if not isinstance(record, dict) or not all(
            _typed(record.get(k), int) for k in ("sentences", "tokens")
        ):
            raise bad
        removed[split] = (record["sentences"], record["tokens"])
    documents, records_skipped = lines.get("documents"), lines.get("records_skipped", 0)
    if (documents is not None and not _typed(documents, int)) or not _typed(records_skipped, int):
        raise bad
    return LineCounts(
        **counts,
        skipped=dict(skipped),
        duplicates=removed,
        documents=documents,
        records_skipped=records_skipped,
        first_skipped=_first_skipped(inputs) if records_skipped else None,
    )


def _first_skipped(inputs: Any) -> tuple[str, int] | None:
    """(path, record number) of the first input that skipped a record, from ``inputs_detail``."""
    for detail in inputs if isinstance(inputs, list) else ():
        if isinstance(detail, dict) and detail.get("records_skipped"):
            path, number = detail.get("path"), detail.get("first_skipped_record")
            if isinstance(path, str) and _typed(number, int):
                return path, number
    return None

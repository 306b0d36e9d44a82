"""The probe set: Brown sentences with their part-of-speech tags, WordNet examples with their senses
(built by ``pipeline/tools/build_probe_set.py``, shipped as package data in ``pipeline/data/probe/``).

``pos.jsonl.gz``: ``{"split": "train"|"test", "file", "tokens": [...], "tags": [...]}`` per sentence;
``wsd.jsonl.gz``: ``{"lemma", "pos", "synset", "sense" (1 = most frequent), "tokens", "target"}`` per
example. Every row is checked as it is read (a probe set is a file like any other input).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from importlib import resources

from pipeline.errors import PipelineError
from pipeline.runtime import storage

SHIPPED = resources.files("pipeline") / "data" / "probe"
MAX_TOKENS_PER_SENTENCE = 250
"""Longer sentences are not read (none is in the shipped set): a probe runs each in one pass."""


class ProbeError(PipelineError):
    """A probe that cannot run: a missing or malformed model or probe set (one line)."""


@dataclass
class PosSplit:
    sentences: list[list[str]] = field(default_factory=list)
    tags: list[list[str]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(map(len, self.sentences))


@dataclass
class WsdExamples:
    sentences: list[list[str]] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    lemmas: list[str] = field(default_factory=list)
    """``lemma.pos``, the group an example is scored in."""
    senses: list[str] = field(default_factory=list)
    """The synset."""
    ranks: list[int] = field(default_factory=list)
    """The sense's rank among the lemma's senses (1 = most frequent by SemCor's counts)."""


@dataclass
class ProbeSet:
    train: PosSplit
    test: PosSplit
    wsd: WsdExamples
    where: str


def _rows(path: str, what: str):
    try:
        data = gzip.decompress(storage.read_bytes(path))
        for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            yield number, row
    except storage.StorageError as err:
        raise ProbeError(f"probe set: {err}") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as err:
        raise ProbeError(f"probe set {path}: not a gzip file of JSON lines ({what}: {err})") from None


def _tokens(row: dict, path: str, number: int) -> list[str]:
    tokens = row.get("tokens")
    if (
        not isinstance(tokens, list)
        or not 0 < len(tokens) <= MAX_TOKENS_PER_SENTENCE
        or not all(isinstance(t, str) and t and t.split() == [t] for t in tokens)
    ):
        raise ProbeError(
            f"probe set {path}: line {number} has no list of 1 to {MAX_TOKENS_PER_SENTENCE} tokens"
        )
    return tokens


def load_probe_set(
    folder: str = "", pos_train: int = 0, pos_test: int = 0, wsd_examples: int = 0
) -> ProbeSet:
    """The probe set in ``folder`` (local or ``s3://``; empty: the shipped one), at most ``pos_train``
    / ``pos_test`` sentences and ``wsd_examples`` examples (0: all), taken spread over the files in
    the order they are stored, so a bounded probe always sees the same sample."""
    where = folder or str(SHIPPED)
    with resources.as_file(SHIPPED) as shipped:
        root = folder or str(shipped)
        pos_path, wsd_path = storage.join(root, "pos.jsonl.gz"), storage.join(root, "wsd.jsonl.gz")
        splits = {"train": PosSplit(), "test": PosSplit()}
        for number, row in _rows(pos_path, "part of speech"):
            tokens, tags, split = _tokens(row, pos_path, number), row.get("tags"), row.get("split")
            if split not in splits or not isinstance(tags, list) or len(tags) != len(tokens):
                raise ProbeError(
                    f"probe set {pos_path}: line {number} needs split train|test and a tag per token"
                )
            splits[split].sentences.append(tokens)
            splits[split].tags.append([str(t) for t in tags])
        wsd = WsdExamples()
        for number, row in _rows(wsd_path, "word sense"):
            tokens, target, rank = _tokens(row, wsd_path, number), row.get("target"), row.get("sense")
            if not (
                isinstance(target, int) and 0 <= target < len(tokens) and isinstance(rank, int) and rank >= 1
            ):
                raise ProbeError(
                    f"probe set {wsd_path}: line {number} needs a target token and a sense rank >= 1"
                )
            wsd.sentences.append(tokens)
            wsd.targets.append(target)
            wsd.lemmas.append(f"{row.get('lemma')}.{row.get('pos')}")
            wsd.senses.append(str(row.get("synset")))
            wsd.ranks.append(rank)
    for split in splits.values():
        if not split.sentences:
            raise ProbeError(f"probe set {pos_path}: no sentences in one of its splits (train, test)")
    return ProbeSet(
        _sample_pos(splits["train"], pos_train),
        _sample_pos(splits["test"], pos_test),
        _sample_wsd(wsd, wsd_examples),
        where,
    )


def _spread(count: int, limit: int) -> list[int]:
    if not limit or count <= limit:
        return list(range(count))
    return [i * count // limit for i in range(limit)]


def _sample_pos(split: PosSplit, limit: int) -> PosSplit:
    keep = _spread(len(split.sentences), limit)
    return PosSplit([split.sentences[i] for i in keep], [split.tags[i] for i in keep])


def _sample_wsd(wsd: WsdExamples, limit: int) -> WsdExamples:
    """Whole lemmas, spread over the set, until ``limit`` examples (a lemma's senses need each other)."""
    if not limit or len(wsd.lemmas) <= limit:
        return wsd
    groups: dict[str, list[int]] = {}
    for i, lemma in enumerate(wsd.lemmas):
        groups.setdefault(lemma, []).append(i)
    order = list(groups.values())
    picked: list[int] = []
    for g in _spread(len(order), max(1, len(order) * limit // len(wsd.lemmas))):
        picked.extend(order[g])
    picked.sort()
    return WsdExamples(*([values[i] for i in picked] for values in vars(wsd).values()))

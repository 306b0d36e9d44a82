"""The shard directory format: blocks in WebDataset tars and the vocabulary files (the manifest
that lists them: :mod:`pipeline.formats.shard_manifest`).

This module is the one implementation of the layout in ``docs/architecture.md`` ("Shard output
format"). The shard stage writes through it; the train and embed stages read through it, so a
change of layout happens here and nowhere else.

A *block* is one WebDataset sample: a run of sentences with their vocabulary ids.

- ``sentences.txt``: UTF-8, one sentence per line, tokens joined by one space.
- ``ids.npy``: int32, shape ``(total_tokens,)``: every sentence's ids concatenated, no boundaries.
- ``lengths.npy``: int32, shape ``(num_sentences,)``: tokens per sentence; sums to ``total_tokens``.

Tars are written with fixed member metadata (mtime 0, fixed owner and mode) so that the same
blocks always give the same bytes, which the shard stage's reruns and sha256 checks rely on.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from pipeline.errors import PipelineError
from pipeline.runtime import storage

if TYPE_CHECKING:
    import webdataset as wds

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)
BOS_ID, EOS_ID, UNK_ID = range(len(SPECIALS))
"""Vocabulary ids of ``<S>``, ``</S>``, ``<UNK>``: every vocabulary starts with the three specials."""
RESERVED_WORDS = frozenset({*SPECIALS, *(s.lower() for s in SPECIALS)})
"""Words no corpus may hold: the specials, and the names KenLM's ARPA files give them."""
"""The first three vocabulary lines, in this order (bilm-tf's vocabulary format)."""

SPLITS = ("train", "heldout")
"""Shard splits, in the order the manifest lists them."""

MANIFEST_FILE = "manifest.json"
VOCAB_FILE = "vocab.txt"
COUNTS_FILE = "vocab_counts.tsv"

SENTENCES_MEMBER = "sentences.txt"
IDS_MEMBER = "ids.npy"
LENGTHS_MEMBER = "lengths.npy"

TAR_MTIME = 0
"""Member mtime of every tar entry: a constant, so output bytes do not depend on the clock."""
TAR_OWNER = "elmo"
TAR_MODE = 0o444


class FormatError(PipelineError, ValueError):
    """A block, vocabulary or manifest that does not follow the format; one line naming it."""


@dataclass(frozen=True)
class Block:
    """One decoded block.

    ``sentences``: S sentences, each a list of tokens.
    ``ids``: int32 array ``(sum(lengths),)``, all sentences' vocabulary ids concatenated.
    ``lengths``: int32 array ``(S,)``, tokens per sentence.
    """

    key: str
    sentences: list[list[str]]
    ids: np.ndarray
    lengths: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.ids.shape[0])

    def sentence_ids(self) -> list[np.ndarray]:
        """Per-sentence id arrays: S views into ``ids``, the i-th of shape ``(lengths[i],)``."""
        return np.split(self.ids, np.cumsum(self.lengths)[:-1]) if len(self.lengths) else []


def shard_name(split: str, shard: int) -> str:
    """File name of shard number ``shard`` of ``split``: ``train-000012.tar``."""
    check_split(split)
    return f"{split}-{shard:06d}.tar"


def block_key(split: str, shard: int, block: int) -> str:
    """The ``__key__`` of block ``block`` in shard ``shard``: ``train-000012-000003``."""
    check_split(split)
    return f"{split}-{shard:06d}-{block:06d}"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise FormatError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def encode_block(sentences: Sequence[Sequence[str]], ids: Any, key: str) -> dict[str, Any]:
    """A WebDataset sample (member name -> bytes, plus ``__key__``) for one block.

    ``sentences``: S non-empty token lists; tokens must be non-empty and hold no whitespace.
    ``ids``: integer array-like ``(sum of sentence lengths,)``, the concatenated vocabulary ids.
    Write the result with a writer from :func:`tar_writer` (it expects bytes, no encoder).
    """
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int32, count=len(sentences))
    lines = []
    for i, sentence in enumerate(sentences):
        line = " ".join(sentence)
        if not sentence or len(line.split()) != len(sentence) or "\n" in line:
            raise FormatError(
                f"block {key}: sentence {i} is empty or has an empty token or one containing whitespace"
            )
        lines.append(line)
    return encode_joined_block(lines, ids, lengths, key)


def encode_joined_block(lines: Sequence[str], ids: Any, lengths: Any, key: str) -> dict[str, Any]:
    """:func:`encode_block` for sentences already joined into lines: ``lines`` S strings of
    ``lengths[i]`` space-separated tokens; ``ids`` ``(sum(lengths),)``. Checks only the array
    shapes; the caller guarantees the lines match ``lengths``."""
    return encode_text_block(("\n".join(lines) + "\n").encode("utf-8"), ids, lengths, key)


def encode_text_block(text: bytes, ids: Any, lengths: Any, key: str) -> dict[str, Any]:
    """:func:`encode_block` from the finished ``sentences.txt`` bytes (the shard stage's fast path,
    which keeps sentences as UTF-8 lines): ``text`` S lines, each ending in ``\\n``, of
    ``lengths[i]`` space-separated tokens; ``ids`` ``(sum(lengths),)``. Checks only the array
    shapes and the line count; the caller guarantees the lines match ``lengths``."""
    lengths = np.asarray(lengths, dtype=np.int32)
    flat = np.asarray(ids)
    if flat.dtype != np.int32:  # int32 ids (the stage's) are used as they are, anything else via int64
        flat = flat.astype(np.int64)
    lines = text.count(b"\n")
    if lengths.ndim != 1 or lengths.shape[0] != lines:
        raise FormatError(f"block {key}: {lines} sentences but lengths of shape {lengths.shape}")
    if flat.ndim != 1 or flat.shape[0] != int(lengths.sum()):
        raise FormatError(f"block {key}: ids have shape {flat.shape}, expected ({int(lengths.sum())},)")
    if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(np.int32).max):
        raise FormatError(f"block {key}: ids out of int32 range")
    return {
        "__key__": key,
        SENTENCES_MEMBER: text,
        IDS_MEMBER: _npy_bytes(np.ascontiguousarray(flat, dtype=np.int32)),
        LENGTHS_MEMBER: _npy_bytes(lengths),
    }


def _member(sample: dict[str, Any], name: str, key: str) -> Any:
    if name not in sample:
        raise FormatError(
            f"block {key}: missing member {name!r} (has {sorted(k for k in sample if not k.startswith('_'))})"
        )
    return sample[name]


def _as_array(value: Any, name: str, key: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.load(io.BytesIO(bytes(value)), allow_pickle=False)
        except (ValueError, OSError) as err:
            raise FormatError(f"block {key}: {name} is not a valid .npy array ({err})") from None
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise FormatError(f"block {key}: {name} must be a 1-d integer array, got {array.dtype} {array.shape}")
    return array.astype(np.int32, copy=False)


def decode_block(sample: dict[str, Any]) -> Block:
    """Decode a sample as WebDataset yields it from a shard (raw bytes per member, or already
    decoded str / ndarray values) and check that its members agree with each other."""
    key = str(sample.get("__key__", "?"))
    where = f"{key} ({sample['__url__']})" if "__url__" in sample else key
    text = _member(sample, SENTENCES_MEMBER, where)
    if not isinstance(text, str):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise FormatError(f"block {where}: {SENTENCES_MEMBER} is not UTF-8 ({err})") from None
    ids = _as_array(_member(sample, IDS_MEMBER, where), IDS_MEMBER, where)
    lengths = _as_array(_member(sample, LENGTHS_MEMBER, where), LENGTHS_MEMBER, where)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sentences = [line.split(" ") for line in lines]
    if len(sentences) != len(lengths):
        raise FormatError(f"block {where}: {len(sentences)} sentences but {len(lengths)} lengths")
    for i, (sentence, length) in enumerate(zip(sentences, lengths, strict=True)):
        if len(sentence) != length:
            raise FormatError(
                f"block {where}: sentence {i} has {len(sentence)} tokens, lengths.npy says {length}"
            )
    if int(lengths.sum()) != ids.shape[0]:
        raise FormatError(f"block {where}: {ids.shape[0]} ids but lengths sum to {int(lengths.sum())}")
    return Block(key=key, sentences=sentences, ids=ids, lengths=lengths)


def tar_writer(fileobj: BinaryIO) -> wds.TarWriter:
    """A WebDataset tar writer over an open binary stream, with fixed member metadata so that the
    same samples always produce the same bytes. Write :func:`encode_block` samples to it."""
    # imported here: webdataset imports torch, which a reader (a read-ahead process) does not need
    import webdataset as wds

    return wds.TarWriter(
        fileobj, user=TAR_OWNER, group=TAR_OWNER, mode=TAR_MODE, encoder=False, mtime=TAR_MTIME
    )


def iter_tar_samples(fileobj: BinaryIO, url: str = "?") -> Iterator[dict[str, Any]]:
    """Raw samples (member name -> bytes, ``__key__``, ``__url__``) of a WebDataset tar stream, in
    file order, grouping consecutive members by the key before the first dot of their name."""
    sample: dict[str, Any] | None = None
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, dot, member = info.name.partition(".")
                if not dot:
                    raise FormatError(f"shard {url}: member {info.name!r} has no extension")
                if sample is None or sample["__key__"] != key:
                    if sample is not None:
                        yield sample
                    sample = {"__key__": key, "__url__": url}
                sample[member] = tar.extractfile(info).read()
    except tarfile.TarError as err:
        raise FormatError(f"shard {url}: not a readable tar ({err})") from None
    if sample is not None:
        yield sample


def read_shard(path: str) -> Iterator[Block]:
    """The decoded blocks of one shard file (local or ``s3://``), in file order."""
    with open_shard(path) as blocks:
        yield from blocks


TAR_TAIL = 2 * 512
"""A tar ends with two zero blocks: the bytes a shard's reader keeps to see that it is whole."""


@contextmanager
def open_shard(path: str, sha256: str = "") -> Iterator[Iterator[Block]]:
    """``with open_shard(path, sha256) as blocks``: the decoded blocks of one shard file, in file
    order; a reader may stop early. With ``sha256`` (the manifest's), the rest of the file is read
    on exit and the whole file checked against it: a damaged, truncated or replaced shard is a
    FormatError naming it, also when the damage first showed as an undecodable block."""
    with storage.open_read(path) as raw:
        stream = storage.HashingReader(raw, tail=TAR_TAIL)
        try:
            yield (decode_block(sample) for sample in iter_tar_samples(stream, url=path))
        except FormatError:
            if sha256:
                _check_hash(stream, path, sha256)
            raise
        if sha256:
            _check_hash(stream, path, sha256)


def _check_hash(stream: storage.HashingReader, path: str, sha256: str) -> None:
    stream.drain()
    got = stream.hexdigest()
    if got == sha256:
        return
    if stream.tail.strip(b"\0") or stream.size < TAR_TAIL:
        raise FormatError(
            f"shard {path} is truncated ({stream.size:,} bytes, no end-of-archive marker; its sha256 "
            f"differs from the manifest's): copy it again or reshard"
        )
    raise FormatError(
        f"shard {path} is damaged or was replaced: sha256 {got[:16]}... where the manifest says "
        f"{sha256[:16]}...; copy it again or reshard"
    )


def encode_vocab(tokens: Sequence[str]) -> bytes:
    """``vocab.txt`` bytes: one token per line, specials first (checked)."""
    _check_vocab(list(tokens), "vocabulary")
    return ("\n".join(tokens) + "\n").encode("utf-8")


def encode_counts(tokens: Sequence[str], counts: Sequence[int]) -> bytes:
    """``vocab_counts.tsv`` bytes: ``token<TAB>count`` per line, in vocabulary order."""
    if len(tokens) != len(counts):
        raise FormatError(f"vocabulary counts: {len(tokens)} tokens but {len(counts)} counts")
    return "".join(f"{t}\t{int(c)}\n" for t, c in zip(tokens, counts, strict=True)).encode("utf-8")


def _check_vocab(tokens: list[str], where: str) -> None:
    if tuple(tokens[:3]) != SPECIALS:
        raise FormatError(f"{where}: must start with {', '.join(SPECIALS)}, found {tokens[:3]}")
    seen: set[str] = set()
    for i, token in enumerate(tokens):
        if not token or token.split() != [token]:
            raise FormatError(f"{where}: line {i + 1} is empty or contains whitespace: {token!r}")
        if token in seen:
            raise FormatError(f"{where}: token {token!r} appears twice (again on line {i + 1})")
        seen.add(token)


def _read_text(path: str, what: str) -> str:
    try:
        return storage.read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"{what} {path} is not UTF-8 ({err})") from None


def parse_vocab(text: str, where: str = "vocabulary") -> list[str]:
    """Tokens of ``vocab.txt`` text, checked: specials first, no duplicates, no blank lines."""
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    _check_vocab(tokens, where)
    return tokens


def read_vocab(path: str) -> list[str]:
    """The tokens of a ``vocab.txt`` (local or ``s3://``); index = vocabulary id."""
    return parse_vocab(_read_text(path, "vocabulary"), path)


def read_counts(path: str) -> list[tuple[str, int]]:
    """``(token, count)`` pairs of a ``vocab_counts.tsv``, in vocabulary order."""
    pairs = []
    for i, line in enumerate(_read_text(path, "vocabulary counts").splitlines()):
        token, tab, count = line.rpartition("\t")
        if not tab or not count.isdigit():
            raise FormatError(f"vocabulary counts {path}: line {i + 1} is not token<TAB>count: {line!r}")
        pairs.append((token, int(count)))
    return pairs


SHA256_HEX = re.compile(r"[0-9a-f]{64}")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A file name inside the shard directory: no folder, no ``..``, no absolute path."""


def read_shard_vocab(vocab_path: str, sha256: str) -> tuple[bytes, list[str]]:
    """A shard directory's vocabulary: its bytes, checked against the sha256 its manifest records
    (a vocabulary of the same size in another order would train ids against the wrong words), and
    its tokens (checked as :func:`parse_vocab` does)."""
    data = storage.read_bytes(vocab_path)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise FormatError(
            f"vocabulary {vocab_path} is not the one its manifest.json records (sha256 differs): the shards' "
            "ids belong to another vocabulary; restore it, or shard the corpus again"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"vocabulary {vocab_path} is not UTF-8 ({err})") from None
    return data, parse_vocab(text, vocab_path)


KNESER_NEY_MAX_ORDER = 5
"""The highest n-gram order of the shard stage's Kneser-Ney baseline (``pipeline.formats.kneser_ney``)."""


UNIGRAM_METRIC = "eval/unigram_perplexity"
"""An eval row's entry for the training unigram's held-out perplexity (metrics.jsonl)."""


def kneser_ney_metric(order: int) -> str:
    """An eval row's entry for the held-out perplexity of the manifest's Kneser-Ney model of ``order``."""
    return f"eval/kneser_ney_{order}gram_perplexity"


def row_baselines(row: dict) -> list[tuple[str, float]]:
    """The held-out baselines an eval row carries, weakest first: ``[("unigram", p), ("Kneser-Ney
    3-gram", p), ...]``."""
    found = [("unigram", row[UNIGRAM_METRIC])] if UNIGRAM_METRIC in row else []
    for order in range(2, KNESER_NEY_MAX_ORDER + 1):
        if kneser_ney_metric(order) in row:
            found.append((f"Kneser-Ney {order}-gram", row[kneser_ney_metric(order)]))
    return found

"""Raw input lines -> tokenized sentences of the two splits, accounting for every line.

Each input line ends in exactly one of these states, and :class:`LineStats` counts them so that
``lines == train_sentences + heldout_sentences + empty + overlong + duplicates`` always holds:

- ``overlong``: more than ``max_line_bytes`` bytes (newline excluded); dropped.
- ``empty``: nothing left after tokenization (blank or whitespace-only); skipped.
- ``duplicates``: a later copy of a sentence of the same split (:mod:`pipeline.shard.duplicates`
  removes them after this module has kept them; ``train_duplicates`` + ``heldout_duplicates``).
- kept as a sentence of the ``train`` or ``heldout`` split.

Invalid UTF-8 is not a reason to drop a line: the bad bytes become U+FFFD and the line is counted
in ``invalid_utf8`` (it is also in one of the states above). Control characters (Unicode category
Cc: U+0000-U+001F, U+007F-U+009F) other than tab, line feed and carriage return become spaces before
tokenization, so ``a\\x00b`` is the two tokens ``a`` and ``b`` and no token holds one; the line is
counted in ``control_chars`` (also in one of the states above). The embed stage reads raw text by
the same rule (:mod:`pipeline.formats.control_chars`).

The kept sentences come out in a compact form (:class:`Sentences`): per split the UTF-8 lines as
one bytes object and every token as an int32 index into the chunk's own vocabulary. It is about
twice the size of the text (Python lists of token strings would be ten times), cheap to move
through Ray's object store, and the writing pass turns it into vocabulary ids with one gather.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from pipeline.formats.control_chars import may_hold_control_chars, replace_control_chars
from pipeline.formats.shard_format import RESERVED_WORDS
from pipeline.formats.tokenizer import Tokenizer
from pipeline.shard.errors import ReservedWordError
from pipeline.shard.split import everything, heldout_rule
from pipeline.shard.vocabulary import local_counts, local_vocabulary


@dataclass
class LineStats:
    """Counts of what happened to the lines of one chunk (or, summed, of a whole run)."""

    lines: int = 0
    empty: int = 0
    overlong: int = 0
    invalid_utf8: int = 0
    control_chars: int = 0
    train_sentences: int = 0
    train_tokens: int = 0
    heldout_sentences: int = 0
    heldout_tokens: int = 0
    max_sentence_tokens: int = 0
    train_duplicates: int = 0
    """Sentences of the training split removed as later copies of one kept (and their tokens, next)."""
    train_duplicate_tokens: int = 0
    heldout_duplicates: int = 0
    heldout_duplicate_tokens: int = 0
    documents: int = 0
    """Documents split into the lines above (records, or text lines with ``split_sentences``); 0 for sentence-per-line text."""
    records_skipped: int = 0
    """Records without a string text field, and JSON Lines lines that are no JSON object (not among the lines above)."""
    first_skipped_record: int = -1
    """The input's number (0-based line or row) of its first skipped record; -1: none (summed: the first in input order)."""

    def add(self, other: LineStats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "max_sentence_tokens":
                self.max_sentence_tokens = max(self.max_sentence_tokens, other.max_sentence_tokens)
            elif f.name == "first_skipped_record":
                if self.first_skipped_record < 0:
                    self.first_skipped_record = other.first_skipped_record
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> LineStats:
        return cls(**data)


@dataclass(frozen=True)
class SplitSentences:
    """One split's kept sentences of a chunk, in input order, in the compact form that the counting
    pass hands to the writing pass (through Ray's object store) instead of tokenizing twice.

    ``text``: UTF-8, each sentence's tokens joined by one space, sentences joined by ``\\n``
    (no trailing newline): exactly the lines of a block's ``sentences.txt``.
    ``ids``: int32 ``(T,)``: every token's index in the chunk's local vocabulary
    (:attr:`Sentences.vocab`), sentences concatenated.
    ``lengths``: int32 ``(S,)``: tokens per sentence; sums to ``T``.
    ``hashes``: uint64 ``(S,)``: each sentence's hash (:func:`pipeline.shard.split.sentence_hash`),
    kept for deduplication; None when the run does not deduplicate.
    """

    text: bytes
    ids: np.ndarray
    lengths: np.ndarray
    hashes: np.ndarray | None = None

    def lines(self) -> list[bytes]:
        """The S sentences as UTF-8 lines (no newline)."""
        return self.text.split(b"\n") if len(self.lengths) else []


@dataclass(frozen=True)
class Sentences:
    """The tokenized sentences of one chunk.

    ``vocab_text``: the chunk's local vocabulary, its distinct tokens (both splits) in order of
    first occurrence, joined by ``\n`` (no token holds whitespace) in UTF-8; :attr:`vocab` is the
    list. ``ids`` of :class:`SplitSentences` index it. Local ids keep the writing pass to one
    dictionary lookup per distinct token (:func:`pipeline.shard.vocabulary.global_ids`) and one
    numpy gather, instead of one lookup per token. One bytes object rather than a list of strings:
    a chunk moving between Ray tasks copies it, where a list of a few hundred thousand tokens is
    pickled and unpickled token by token (most of a deduplicating task's time, before).
    """

    vocab_text: bytes
    train: SplitSentences
    heldout: SplitSentences
    stats: LineStats

    @functools.cached_property
    def vocab(self) -> list[str]:
        """The local vocabulary as a list (made once per process that asks)."""
        return self.vocab_text.decode("utf-8").split("\n") if self.vocab_text else []

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("vocab", None)  # the cached list never travels: vocab_text does
        return state

    def split(self, name: str) -> SplitSentences:
        return self.train if name == "train" else self.heldout

    def tokens(self, name: str) -> list[list[str]]:
        """The token lists of one split's sentences (for tests and inspection; not a fast path)."""
        part = self.split(name)
        return [line.decode("utf-8").split(" ") for line in part.lines()]

    def train_counts(self) -> tuple[list[str], np.ndarray]:
        """The tokens of the training split and their occurrences, int64 ``(K,)``."""
        return local_counts(self.vocab, self.train.ids)

    @property
    def nbytes(self) -> int:
        """About the size of the arrays and text (what Ray stores for it), vocabulary excluded."""
        parts = (self.train, self.heldout)
        return sum(
            len(p.text) + p.ids.nbytes + p.lengths.nbytes + (0 if p.hashes is None else p.hashes.nbytes)
            for p in parts
        )


def raw_lines(data: bytes) -> list[bytes]:
    """The lines of a chunk: split on ``\\n`` only (a final line may lack it); ``\\r`` is left to
    whitespace normalisation so CRLF files work."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def decode_lines(data: bytes, max_line_bytes: int = 0) -> tuple[list[str | None], int]:
    """``(lines, lines_with_invalid_utf8)``; a line over ``max_line_bytes`` bytes (0: no limit)
    is None. Invalid byte sequences become U+FFFD. A valid chunk (the common case) is decoded in
    one call rather than line by line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        lines: list[str | None] = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        if max_line_bytes:
            # characters <= UTF-8 bytes <= 4 * characters: encode only lines that may be too long
            maybe = max_line_bytes // 4
            lines = [
                None if len(line) > maybe and len(line.encode("utf-8")) > max_line_bytes else line
                for line in lines
            ]
        return lines, 0
    lines, invalid = [], 0
    for raw in raw_lines(data):
        if max_line_bytes and len(raw) > max_line_bytes:
            lines.append(None)
            continue
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(raw.decode("utf-8", errors="replace"))
            invalid += 1
    return lines, invalid


def tokenize_lines(
    data: bytes,
    tokenize: Tokenizer,
    max_line_bytes: int,
    heldout_threshold: int,
    all_heldout: bool = False,
    dropped_overlong: int = 0,
    keep_hashes: bool = False,
) -> Sentences:
    """Split, decode, filter, tokenize and assign a split to every line of ``data``.

    ``heldout_threshold``: from :func:`pipeline.shard.split.heldout_threshold`; ``all_heldout``
    puts every sentence in the held-out split (explicit held-out inputs); ``dropped_overlong``:
    overlong lines the reader already dropped (counted as lines and as overlong); ``keep_hashes``:
    keep every sentence's hash (:attr:`SplitSentences.hashes`), for deduplication.
    """
    lines, invalid = decode_lines(data, max_line_bytes)
    control = 0
    if may_hold_control_chars(data):
        for i, text in enumerate(lines):
            if text is not None:
                lines[i], replaced = replace_control_chars(text)
                control += replaced
    rule = everything if all_heldout else heldout_rule(heldout_threshold)
    hashing = keep_hashes or (rule is not None and rule is not everything)
    blake2b = hashlib.blake2b
    # per split: the joined sentences, all their tokens (flat), the tokens per sentence, the digests
    train: tuple[list[str], list[str], list[int], list[bytes]] = ([], [], [], [])
    heldout: tuple[list[str], list[str], list[int], list[bytes]] = ([], [], [], [])
    overlong, empty, digest = dropped_overlong, 0, b""
    for text in lines:  # the stage's hottest loop: once per input line
        if text is None:
            overlong += 1
            continue
        tokens = tokenize(text)
        if not tokens:
            empty += 1
            continue
        sentence = " ".join(tokens)
        if hashing:  # split.sentence_digest, inline: a Python call per sentence costs ~5% here
            digest = blake2b(sentence.encode("utf-8"), digest_size=8).digest()
            held = rule is not None and rule(digest)
        else:
            held = rule is not None  # everything or nothing held out
        joined, flat, lengths, digests = heldout if held else train
        joined.append(sentence)
        flat.extend(tokens)
        lengths.append(len(tokens))
        digests.append(digest)
    vocab, ids = local_vocabulary(train[1] + heldout[1])
    reserved = RESERVED_WORDS.intersection(vocab)  # per distinct word of the chunk, not per sentence
    if reserved:
        word = min(reserved, key=vocab.index)
        line = next(text for text in lines if text is not None and word in tokenize(text))
        raise ReservedWordError(word, line)
    cut = len(train[1])
    stats = LineStats(
        lines=len(lines) + dropped_overlong,
        empty=empty,
        overlong=overlong,
        invalid_utf8=invalid,
        control_chars=control,
        train_sentences=len(train[2]),
        train_tokens=cut,
        heldout_sentences=len(heldout[2]),
        heldout_tokens=len(heldout[1]),
        max_sentence_tokens=max(max(train[2], default=0), max(heldout[2], default=0)),
    )
    return Sentences(
        "\n".join(vocab).encode("utf-8"),
        _compact(train, ids[:cut], keep_hashes),
        _compact(heldout, ids[cut:], keep_hashes),
        stats,
    )


def _compact(split: tuple[list, list, list, list], ids: np.ndarray, keep_hashes: bool) -> SplitSentences:
    joined, _, lengths, digests = split
    hashes = np.frombuffer(b"".join(digests), dtype=">u8").astype(np.uint64) if keep_hashes else None
    return SplitSentences("\n".join(joined).encode("utf-8"), ids, np.array(lengths, dtype=np.int32), hashes)

"""Raw input lines -> tokenized sentences of the two splits, accounting for every line.

Each input line ends in exactly one of these states, and :class:`LineStats` counts them so that
``lines == train_sentences + heldout_sentences + empty + overlong`` always holds:

- ``overlong``: more than ``max_line_bytes`` bytes (newline excluded); dropped.
- ``empty``: nothing left after tokenization (blank or whitespace-only); skipped.
- kept as a sentence of the ``train`` or ``heldout`` split.

Invalid UTF-8 is not a reason to drop a line: the bad bytes become U+FFFD and the line is counted
in ``invalid_utf8`` (it is also in one of the states above).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pipeline.shard.split import is_heldout
from pipeline.shard.tokenizer import Tokenizer


@dataclass
class LineStats:
    """Counts of what happened to the lines of one chunk (or, summed, of a whole run)."""

    lines: int = 0
    empty: int = 0
    overlong: int = 0
    invalid_utf8: int = 0
    train_sentences: int = 0
    train_tokens: int = 0
    heldout_sentences: int = 0
    heldout_tokens: int = 0
    max_sentence_tokens: int = 0

    def add(self, other: LineStats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "max_sentence_tokens":
                self.max_sentence_tokens = max(self.max_sentence_tokens, other.max_sentence_tokens)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> LineStats:
        return cls(**data)


@dataclass
class Sentences:
    """The sentences of one chunk: per split, the tokens of each kept sentence, in input order."""

    train: list[list[str]] = field(default_factory=list)
    heldout: list[list[str]] = field(default_factory=list)
    stats: LineStats = field(default_factory=LineStats)

    def split(self, name: str) -> list[list[str]]:
        return self.train if name == "train" else self.heldout


def raw_lines(data: bytes) -> list[bytes]:
    """The lines of a chunk: split on ``\\n`` only (a final line may lack it); ``\\r`` is left to
    whitespace normalisation so CRLF files work."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def decode_line(raw: bytes) -> tuple[str, bool]:
    """``(text, had_invalid_utf8)``; invalid byte sequences become U+FFFD."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def tokenize_lines(
    data: bytes,
    tokenize: Tokenizer,
    max_line_bytes: int,
    heldout_threshold: int,
    all_heldout: bool = False,
    dropped_overlong: int = 0,
) -> Sentences:
    """Split, decode, filter, tokenize and assign a split to every line of ``data``.

    ``heldout_threshold``: from :func:`pipeline.shard.split.heldout_threshold`; ``all_heldout``
    puts every sentence in the held-out split (explicit held-out inputs); ``dropped_overlong``:
    overlong lines the reader already dropped (counted as lines and as overlong).
    """
    out = Sentences()
    stats = out.stats
    lines = raw_lines(data)
    stats.lines = len(lines) + dropped_overlong
    stats.overlong = dropped_overlong
    for raw in lines:
        if max_line_bytes and len(raw) > max_line_bytes:
            stats.overlong += 1
            continue
        text, invalid = decode_line(raw)
        stats.invalid_utf8 += invalid
        tokens = tokenize(text)
        if not tokens:
            stats.empty += 1
            continue
        if all_heldout or is_heldout(" ".join(tokens), heldout_threshold):
            out.heldout.append(tokens)
            stats.heldout_sentences += 1
            stats.heldout_tokens += len(tokens)
        else:
            out.train.append(tokens)
            stats.train_sentences += 1
            stats.train_tokens += len(tokens)
        stats.max_sentence_tokens = max(stats.max_sentence_tokens, len(tokens))
    return out

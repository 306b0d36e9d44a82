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
) -> Sentences:
    """Split, decode, filter, tokenize and assign a split to every line of ``data``.

    ``heldout_threshold``: from :func:`pipeline.shard.split.heldout_threshold`; ``all_heldout``
    puts every sentence in the held-out split (explicit held-out inputs); ``dropped_overlong``:
    overlong lines the reader already dropped (counted as lines and as overlong).
    """
    out = Sentences()
    stats = out.stats
    lines, invalid = decode_lines(data, max_line_bytes)
    stats.lines = len(lines) + dropped_overlong
    stats.invalid_utf8 = invalid
    overlong, empty, longest = dropped_overlong, 0, 0
    train, heldout = out.train, out.heldout
    for text in lines:
        if text is None:
            overlong += 1
            continue
        tokens = tokenize(text)
        if not tokens:
            empty += 1
            continue
        if all_heldout or (heldout_threshold and is_heldout(" ".join(tokens), heldout_threshold)):
            heldout.append(tokens)
        else:
            train.append(tokens)
        if len(tokens) > longest:
            longest = len(tokens)
    stats.overlong, stats.empty, stats.max_sentence_tokens = overlong, empty, longest
    stats.train_sentences, stats.heldout_sentences = len(train), len(heldout)
    stats.train_tokens = sum(map(len, train))
    stats.heldout_tokens = sum(map(len, heldout))
    return out

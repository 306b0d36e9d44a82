"""From raw input lines to the token lists the biLM embeds (pure functions).

A line is split on ``\\n`` only, decoded as UTF-8, stripped and split on whitespace, as AllenNLP's
``elmo`` command did (``line.strip()`` then ``.split()``). The four kinds of bad line get a
defined result instead of AllenNLP's refusal:

- empty (or all-whitespace) line: the empty sentence; its value has zero tokens, e.g. shape
  (N+1, 0, 2P) for ``all``; it is not run through the model (so in stateful mode it does not touch
  the carried state) and is counted as ``empty_sentences``;
- invalid UTF-8: bad bytes become U+FFFD (counted as ``invalid_utf8_lines``), or an error;
- control characters other than tab and carriage return: spaces for tokenization, by the shard stage's
  rule (:mod:`pipeline.formats.control_chars`; the model was trained on text read
  that way), so ``a\\x00b`` is two tokens; counted as ``control_char_lines``. The stripped line (its
  ``sentence_to_index`` key) keeps them;
- more than ``max_tokens`` tokens: cut into consecutive pieces of at most ``max_tokens`` tokens that
  are embedded independently and concatenated along the token axis (counted as ``split_sentences``),
  or an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.embed.errors import EmbedError
from pipeline.formats.control_chars import replace_control_chars


@dataclass
class PreparedLines:
    """The sentences of one run of consecutive input lines.

    ``texts[i]``: stripped text of line ``first_line + i`` (the key of AllenNLP's ``sentence_to_index``).
    ``pieces[i]``: the token lists embedded for that line: ``[]`` for an empty line, one list normally,
    several for a split line.
    """

    first_line: int
    texts: list[str] = field(default_factory=list)
    pieces: list[list[list[str]]] = field(default_factory=list)
    empty_sentences: int = 0
    invalid_utf8_lines: int = 0
    control_char_lines: int = 0
    split_sentences: int = 0

    @property
    def num_lines(self) -> int:
        return len(self.texts)

    @property
    def num_tokens(self) -> int:
        return sum(len(piece) for pieces in self.pieces for piece in pieces)


def decode_line(raw: bytes, line_number: int, invalid_utf8: str, where: str) -> tuple[str, bool]:
    """UTF-8 text of one raw line (no newline) and whether bytes had to be replaced."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError as err:
        if invalid_utf8 == "error":
            raise EmbedError(
                f"{where}: line {line_number} is not valid UTF-8 (byte {err.start}); "
                "fix the input or set invalid_utf8=replace"
            ) from None
        return raw.decode("utf-8", errors="replace"), True


def split_tokens(tokens: Sequence[str], max_tokens: int) -> list[list[str]]:
    """Consecutive pieces of at most ``max_tokens`` tokens (one piece when it fits; none when empty)."""
    return [list(tokens[i : i + max_tokens]) for i in range(0, len(tokens), max_tokens)]


def prepare_lines(
    raw_lines: Sequence[bytes],
    first_line: int,
    *,
    max_tokens: int,
    long_sentences: str,
    invalid_utf8: str,
    where: str,
    tokenize: Callable[[str], list[str]] = str.split,
) -> PreparedLines:
    """Decode, strip and tokenize ``raw_lines`` (input lines ``first_line``, ``first_line + 1``,
    ...) with ``tokenize`` (a line -> its tokens; ``formats.tokenizer.make_tokenizer``)."""
    out = PreparedLines(first_line=first_line)
    for offset, raw in enumerate(raw_lines):
        number = first_line + offset
        text, replaced = decode_line(raw, number, invalid_utf8, where)
        text = text.strip()
        spaced, control = replace_control_chars(text)
        tokens = tokenize(spaced)
        out.invalid_utf8_lines += replaced
        out.control_char_lines += control
        out.empty_sentences += not tokens
        if len(tokens) > max_tokens:
            if long_sentences == "error":
                raise EmbedError(
                    f"{where}: line {number} has {len(tokens)} tokens, more than max_sentence_tokens="
                    f"{max_tokens}; set long_sentences=split or raise max_sentence_tokens"
                )
            out.split_sentences += 1
        out.texts.append(text)
        out.pieces.append(split_tokens(tokens, max_tokens))
    return out


def prepare_token_lists(
    rows: Sequence[Sequence[str] | None], *, max_tokens: int, where: str
) -> PreparedLines:
    """Sentences given as token lists (a user's own tokenization): each token embedded as given,
    never joined and split again (``["New York", "is"]`` is two tokens), a row of none the empty
    sentence, a row over ``max_tokens`` embedded in pieces. A token that is not a non-empty string
    is one line of error naming its row."""
    out = PreparedLines(first_line=0)
    for row, tokens in enumerate(rows):
        tokens = list(tokens or ())
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise EmbedError(f"{where}: row {row} has the token {token!r}; tokens are non-empty strings")
        out.empty_sentences += not tokens
        out.split_sentences += len(tokens) > max_tokens
        out.texts.append(" ".join(tokens))
        out.pieces.append(split_tokens(tokens, max_tokens))
    return out

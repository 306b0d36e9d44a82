"""Word tokenizers: a line of text -> a list of tokens.

``whitespace``: for corpora that are already tokenized (the 1B Word Benchmark): split on any run of
Unicode whitespace, which also normalises the whitespace.

``moses``: for raw text. We use ``sacremoses``, the maintained pure-Python port of the Moses
tokenizer scripts (the tokenization behind the 1B Word Benchmark and most MT corpora), so raw text
is cut the way the original ELMo training data was: punctuation and clitics split off
(``said,`` -> ``said ,``; ``Don't`` -> ``Don 't``) with per-language non-breaking prefixes
(``e.g.``, ``U.S.A.`` stay whole). It is pure Python (no compiled extension to build on a cluster
image), deterministic, and close to reversible through its detokenizer. We call it with
``escape=False`` so that ``&`` or ``"`` stay themselves instead of becoming XML entities.

Every tokenizer returns tokens that are non-empty and contain no whitespace (the block format
joins tokens with one space), optionally lowercased.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from functools import lru_cache


class TokenizerName(enum.Enum):
    whitespace = "whitespace"
    """The input is already tokenized: split on whitespace."""
    moses = "moses"
    """Raw text: the Moses rules of ``moses_lang`` (sacremoses)."""


TOKENIZERS = tuple(name.value for name in TokenizerName)
"""Valid values of a stage's ``tokenizer`` (the shard stage's, the embed stage's)."""


@functools.cache
def moses_languages() -> frozenset[str]:
    """The language codes sacremoses has rules for (two letters; it silently falls back to none
    for any other)."""
    from sacremoses.corpus import NonbreakingPrefixes

    return frozenset(code for code in NonbreakingPrefixes().available_langs if len(code) <= 3)


def moses_lang_rule(tokenizer: TokenizerName, moses_lang: str) -> tuple:
    """A config's ``moses_lang`` rule (``pipeline.config.check_rules``): a language the Moses rules
    know, when the Moses tokenizer is chosen."""
    if tokenizer is not TokenizerName.moses:
        return ("moses_lang", moses_lang, True, "")
    known = moses_languages()
    return (
        "moses_lang",
        moses_lang,
        moses_lang in known,
        f"a language the Moses rules know ({', '.join(sorted(known))})",
    )


Tokenizer = Callable[[str], list[str]]
"""A line of text (no newline) -> its tokens."""


def whitespace_tokens(line: str) -> list[str]:
    return line.split()


@lru_cache(maxsize=4)
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def moses_tokenizer(lang: str) -> Tokenizer:
    """A Moses tokenizer for language ``lang`` (built once per process)."""
    moses = _moses(lang)

    def tokenize(line: str) -> list[str]:
        line = " ".join(line.split())
        if not line:
            return []
        # Moses never emits whitespace itself, but split again so the invariant holds for any input
        return " ".join(moses.tokenize(line, escape=False)).split()

    return tokenize


def _lowercased(tokenize: Tokenizer) -> Tokenizer:
    def lower(line: str) -> list[str]:
        return [token.lower() for token in tokenize(line)]

    return lower


def make_tokenizer(name: str, lang: str = "en", lowercase: bool = False) -> Tokenizer:
    """The tokenizer called ``name`` (one of :data:`TOKENIZERS`)."""
    if name == "whitespace":
        tokenize = whitespace_tokens
    elif name == "moses":
        tokenize = moses_tokenizer(lang)
    else:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")
    return _lowercased(tokenize) if lowercase else tokenize

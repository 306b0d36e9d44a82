"""A synthetic corpus shaped like the 1B Word Benchmark, of any size, streamed to a file.

    python benchmarks/synthetic_corpus.py /tmp/synth-10m.txt.gz --tokens 10_000_000
    python benchmarks/synthetic_corpus.py /tmp/synth-800m.txt.gz --tokens 800_000_000 --seed 1

One sentence per line, tokens separated by spaces (the shard stage's whitespace tokenizer reads it
back token for token). Deterministic from the seed: the same arguments give the same bytes.
- **Types**: ``--types`` spellings (800,000 by default, the benchmark's vocabulary is 793k), drawn
  from English letter frequencies with realistic lengths; frequent types are short, as in English;
  about 8% are capitalised (names), 1% are numbers, and the most frequent ranks hold punctuation
  tokens (``.`` ``,`` ``'s`` ...), which the benchmark's tokenization splits off.
- **Frequencies**: a Zipf-Mandelbrot law over the ranks, p(r) ~ 1 / (r + 2.7)^1.0.
- **Sentence lengths**: log-normal with a mean of about 27 tokens and a long tail (1 to 300).
Memory stays bounded by one block of ``--block-tokens`` tokens and the spelling table (~10 MB),
whatever the size; a `.gz` suffix writes gzip (level 1, for speed).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
LETTER_FREQ = np.array(
    [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0,
     1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07]
)  # fmt: skip
PUNCTUATION = [".", ",", "'s", '"', "-", ":", "(", ")", "?", "'", ";", "!", "$", "%", "n't", "--"]
"""The most frequent ranks (after the first few words), as in the tokenized benchmark."""
ZIPF_EXPONENT, ZIPF_SHIFT = 1.0, 2.7
MEAN_SENTENCE_TOKENS, LENGTH_SIGMA, MAX_SENTENCE_TOKENS = 27.0, 0.55, 300


def spellings(types: int, rng: np.random.Generator) -> list[str]:
    """``types`` distinct spellings in rank order (most frequent first)."""
    alphabet = np.array(list(LETTERS))
    words: list[str] = []
    seen = set(PUNCTUATION)
    while len(words) < types - len(PUNCTUATION):
        lengths = np.clip(np.rint(rng.gamma(4.0, 1.6, size=types)), 1, 18).astype(int)
        letters = rng.choice(len(LETTERS), size=int(lengths.sum()), p=LETTER_FREQ / LETTER_FREQ.sum())
        ends = np.cumsum(lengths)
        for start, end in zip((ends - lengths).tolist(), ends.tolist(), strict=True):
            word = "".join(alphabet[letters[start:end]])
            if word not in seen and len(words) < types - len(PUNCTUATION):
                seen.add(word)
                words.append(word)
    words.sort(key=len)  # frequent types are short (stable: ties keep their random order)
    first = 20  # the most frequent words stay lower-case words
    slots = rng.choice(np.arange(first, len(words)), size=types * 9 // 100, replace=False).tolist()
    names, numbers = slots[: types * 8 // 100], slots[types * 8 // 100 :]
    for i in names:
        words[i] = words[i].capitalize()
    for k, i in enumerate(numbers):  # distinct: years, and decimals with a distinct integer part
        words[i] = str(1900 + k) if k % 3 else f"{k}.{k % 10}"
    return words[:4] + PUNCTUATION + words[4:]


def rank_cdf(types: int) -> np.ndarray:
    weights = 1.0 / (np.arange(1, types + 1) + ZIPF_SHIFT) ** ZIPF_EXPONENT
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def sentence_lengths(rng: np.random.Generator, count: int) -> np.ndarray:
    mu = np.log(MEAN_SENTENCE_TOKENS) - LENGTH_SIGMA**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, LENGTH_SIGMA, size=count)), 1, MAX_SENTENCE_TOKENS).astype(
        np.int64
    )


def blocks(tokens: int, types: int, seed: int, block_tokens: int) -> Iterator[bytes]:
    """The corpus as byte blocks of whole lines, ``tokens`` tokens in all."""
    rng = np.random.default_rng(seed)
    words = spellings(types, rng)
    with_space = [w.encode() + b" " for w in words]
    with_newline = [w.encode() + b"\n" for w in words]
    cdf = rank_cdf(types)
    left = tokens
    while left > 0:
        want = min(block_tokens, left)
        lengths = sentence_lengths(rng, max(1, int(want / MEAN_SENTENCE_TOKENS * 1.2) + 8))
        ends = np.cumsum(lengths)
        lengths = lengths[: int(np.searchsorted(ends, want)) + 1]
        lengths[-1] -= max(0, int(lengths.sum()) - want)  # the last sentence ends the block exactly
        ids = np.searchsorted(cdf, rng.random(int(lengths.sum())), side="right")
        parts = [with_space[i] for i in ids.tolist()]
        for end in (np.cumsum(lengths) - 1).tolist():
            parts[end] = with_newline[ids[end]]
        yield b"".join(parts)
        left -= int(lengths.sum())


def write_corpus(path: Path, tokens: int, types: int, seed: int, block_tokens: int = 2_000_000) -> None:
    opener = (
        (lambda p: gzip.open(p, "wb", compresslevel=1)) if path.suffix == ".gz" else (lambda p: open(p, "wb"))
    )
    with opener(path) as out:
        for block in blocks(tokens, types, seed, block_tokens):
            out.write(block)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="file to write (.gz: gzip)")
    parser.add_argument("--tokens", type=int, required=True, help="tokens in all (1M to 1B and more)")
    parser.add_argument("--types", type=int, default=800_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-tokens", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.types < len(PUNCTUATION) + 100:
        parser.error("--tokens must be >= 1 and --types >= 116")
    start = time.monotonic()
    write_corpus(args.output, args.tokens, args.types, args.seed, args.block_tokens)
    seconds = time.monotonic() - start
    print(
        f"wrote {args.output}: {args.tokens:,} tokens, {args.types:,} types, seed {args.seed}, "
        f"{args.output.stat().st_size / 2**20:,.1f} MiB in {seconds:.1f} s ({args.tokens / seconds:,.0f} tokens/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

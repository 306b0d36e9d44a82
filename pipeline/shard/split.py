"""The held-out split: a sentence is held out when a stable hash of its text falls below a threshold.

The hash is BLAKE2b of the sentence's UTF-8 bytes (tokens joined by one space), not Python's
``hash()``, which is salted per process: the same sentence is held out in every run, on every
worker, whatever the worker count or chunking, and duplicates of a sentence share a split (so
the held-out set does not leak into training through repeated lines).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

HASH_BITS = 64
_SCALE = 1 << HASH_BITS


def heldout_threshold(fraction: float) -> int:
    """Hash values below this are held out: ``fraction`` of the 64-bit hash space."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {fraction}")
    return min(_SCALE, int(round(fraction * _SCALE)))


def sentence_hash(sentence: str) -> int:
    """A 64-bit hash of the sentence text, the same in every process and on every machine."""
    return int.from_bytes(hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest(), "big")


def is_heldout(sentence: str, threshold: int) -> bool:
    """Whether ``sentence`` (tokens joined by one space) belongs to the held-out split."""
    if threshold <= 0:
        return False
    if threshold >= _SCALE:
        return True
    return sentence_hash(sentence) < threshold


def heldout_rule(threshold: int) -> Callable[[str], bool] | None:
    """:func:`is_heldout` with ``threshold`` fixed, for testing many sentences: None when nothing is
    held out (the caller skips hashing altogether).

    The digest is compared as bytes rather than converted to an int: an 8-byte big-endian digest
    orders exactly like its integer, and the shard stage calls this once per sentence."""
    if threshold <= 0:
        return None
    if threshold >= _SCALE:
        return lambda sentence: True
    limit = threshold.to_bytes(HASH_BITS // 8, "big")
    blake2b = hashlib.blake2b

    def rule(sentence: str) -> bool:
        return blake2b(sentence.encode("utf-8"), digest_size=HASH_BITS // 8).digest() < limit

    return rule

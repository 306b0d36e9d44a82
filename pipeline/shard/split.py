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


def sentence_digest(sentence: str) -> bytes:
    """The 8-byte big-endian digest whose integer is :func:`sentence_hash`: compared as bytes, it
    orders exactly like the integer, and the shard stage computes it once per sentence."""
    return hashlib.blake2b(sentence.encode("utf-8"), digest_size=HASH_BITS // 8).digest()


def everything(digest: bytes) -> bool:
    """The rule that holds out every sentence (``heldout_fraction`` 1, or an explicit held-out input)."""
    return True


def heldout_rule(threshold: int) -> Callable[[bytes], bool] | None:
    """:func:`is_heldout` on a sentence's digest (:func:`sentence_digest`) with ``threshold`` fixed:
    None when nothing is held out (the caller may skip hashing altogether), :func:`everything`
    when all is."""
    if threshold <= 0:
        return None
    if threshold >= _SCALE:
        return everything
    return threshold.to_bytes(HASH_BITS // 8, "big").__gt__  # digest < limit, without a Python frame

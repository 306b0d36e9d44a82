"""Compressed data known by its first bytes, not by its name: shard reads gzip input (and refuses
the other formats), embed refuses all of them (it reads its input by byte range)."""

from __future__ import annotations

MAGIC = {
    "gzip": b"\x1f\x8b",
    "bzip2": b"BZh",
    "xz": b"\xfd7zXZ\x00",
    "zstd": b"\x28\xb5\x2f\xfd",
    "zip": b"PK\x03\x04",
    "lz4": b"\x04\x22\x4d\x18",
}
HEAD_BYTES = max(len(magic) for magic in MAGIC.values())
"""Bytes of a file's start that :func:`compression_of` needs."""


def compression_of(head: bytes) -> str | None:
    """The compressed format whose magic bytes ``head`` (a file's first bytes) starts with, or None."""
    for name, magic in MAGIC.items():
        if head.startswith(magic):
            return name
    return None

"""Hashing what streams through storage: the one implementation every stage's writer and reader uses."""

from __future__ import annotations

import hashlib
import io
from typing import BinaryIO

HASH_CHUNK = 8 * 1024 * 1024
"""Bytes read per step when hashing a file, streamed so memory stays flat for any file size."""


class HashingWriter(io.RawIOBase):
    """``out`` (a stream of :func:`open_write`, or any binary sink) with every byte written also
    hashed (sha256) and counted: what a stage writes is known by its hash without reading it
    back. ``hexdigest()`` and ``size`` once written; ``tell()`` is the bytes written so far."""

    def __init__(self, out: BinaryIO):
        self.out, self.digest, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.out.write(data)
        self.digest.update(data)
        size = memoryview(data).nbytes
        self.size += size
        return size

    def tell(self) -> int:
        return self.size

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


class HashingReader(io.RawIOBase):
    """``raw`` (a stream of :func:`open_read`) with every byte read also hashed (sha256) and
    counted, keeping the last ``tail`` bytes read (a tar's end-of-archive marker, say);
    ``drain()`` reads the rest, so that ``hexdigest()`` is the whole file's."""

    def __init__(self, raw: BinaryIO, tail: int = 0):
        self.raw, self.digest, self.size = raw, hashlib.sha256(), 0
        self.keep, self.tail = tail, b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        self.size += len(data)
        if self.keep:  # the last bytes, without copying a large read whole
            self.tail = data[-self.keep :] if len(data) >= self.keep else (self.tail + data)[-self.keep :]
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(HASH_CHUNK):
            pass

    def hexdigest(self) -> str:
        return self.digest.hexdigest()

"""One direction's sentences for one rank, from a shard directory (docs/training.md#batching):
the rank split, the shard and sentence orders, and reading the next shard ahead.

Rank split: with at least as many shards as ranks, rank r reads shards ``r, r+W, r+2W, ...`` (in
manifest order). With fewer shards than ranks every rank reads every shard but keeps only the
sentences whose index within the shard is ``r mod W``; sentences rather than blocks, so that even a
one-block shard splits evenly and no rank is left without data. Training streams cycle forever,
so ranks with more data never outlast the others: the step count (``run_length.steps_per_epoch``) is the
same on every rank and uneven shards cannot hang DDP.

When a :class:`SentenceSource` starts a shard it has the next shard of its order read and laid out
in a background process, so a shard boundary does not stall the step loop, nor does the decoding
take the interpreter from it (the layout is a function of the position alone: the batches are the
same).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from pipeline.runtime import storage
from pipeline.runtime.background import HelperProcess, in_thread
from pipeline.train.shard_reading import (
    LayoutPlan,
    ShardSentences,
    WrappedSentences,
    read_layout,
    read_shard_sentences,
    seeded_rng,
)

_SHARD_ORDER_TAG = 0
_SENTENCE_ORDER_TAG = 1


READ_AHEAD_TIMEOUT_S = 600.0
"""How long a stream waits for its read-ahead process's shard: a stopped or hung helper (reading a
shard takes seconds, even from S3) ends the run with a message naming it instead of a silent hang."""


class ReadAhead(enum.Enum):
    """Where a stream reads its next shard while it trains on the current one."""

    process = "process"
    """A helper process per stream (both directions, pipeline.runtime.background.HelperProcess): the
    decoding does not hold this process's interpreter."""
    thread = "thread"
    """A thread: no process to start, but the decoding competes with the step loop for the GIL."""
    off = "off"
    """No read ahead: a shard is read when the stream reaches it."""


def rank_shards(n_shards: int, rank: int, world_size: int) -> tuple[list[int], tuple[int, int] | None]:
    """The rank split (module docstring): the indices of the shards ``rank`` reads, and the
    ``(rank, world_size)`` sentence stride it applies inside each (None: it keeps every sentence)."""
    if n_shards >= world_size:
        return list(range(rank, n_shards, world_size)), None
    return list(range(n_shards)), (rank, world_size)


def rank_sentence_count(shard_sentences: Sequence[int], rank: int, world_size: int) -> int:
    """Sentences ``rank`` reads from shards holding ``shard_sentences`` (manifest counts) each."""
    shards, stride = rank_shards(len(shard_sentences), rank, world_size)
    if stride is None:
        return sum(shard_sentences[i] for i in shards)
    return sum(len(range(rank, shard_sentences[i], world_size)) for i in shards)


class SentenceSource:
    """One direction's sentence generator for one rank (bilm-tf's ``LMDataset`` sentence stream).

    Training (``test=False``): shards in a seeded random order per pass (each of the rank's shards
    once per pass), sentences shuffled per shard with a seed of ``(seed, stream, pass, shard)``,
    cycling forever. Test: the rank's shards once, in manifest order, sentences in stored order
    (bilm-tf's ``run_test`` reads reversed glob order; the order only decides which sentences fall
    in the dropped tail).

    Position: ``pass_index``, ``shard_pos`` (index into this pass's shard order) and ``offset``
    (sentences already handed out from that shard).

    ``prefetch``: on starting a shard, have the next one of the order read and laid out
    (:class:`ReadAhead`; one shard ahead, so at most two shards' layouts are held); a read error
    surfaces when that shard is needed. ``ReadAhead.off`` reads every shard when the stream reaches it.
    ``process``: the :class:`HelperProcess` to use with ``ReadAhead.process`` (shared by a
    stream's two directions); by default the source starts its own at its first read ahead, and
    :meth:`close` ends it.
    """

    def __init__(
        self,
        urls: Sequence[str],
        vocab_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        stream: int = 0,
        reverse: bool = False,
        test: bool = False,
        sizes: Sequence[tuple[int, int, str]] | None = None,
        reader: Callable[..., ShardSentences] = read_shard_sentences,
        prefetch: ReadAhead = ReadAhead.process,
        process: HelperProcess | None = None,
    ):
        if not urls:
            raise ValueError("SentenceSource: no shards to read")
        if not 0 <= rank < world_size:
            raise ValueError(f"SentenceSource: rank {rank} is outside world size {world_size}")
        if seed < 0:
            raise ValueError(f"SentenceSource: seed must be >= 0, got {seed}")
        if sizes is not None and len(sizes) != len(urls):
            raise ValueError(f"SentenceSource: {len(urls)} shards but {len(sizes)} manifest sizes")
        self.urls = list(urls)
        self.vocab_size = vocab_size
        self.rank, self.world_size, self.seed, self.stream = rank, world_size, seed, stream
        self.reverse, self.test = reverse, test
        self.sizes = list(sizes) if sizes is not None else None
        self.reader = reader
        self.prefetch = prefetch
        self.shards, self.stride = rank_shards(len(self.urls), rank, world_size)
        self.pass_index = self.shard_pos = self.offset = 0
        self._loaded: tuple[tuple[int, int], WrappedSentences] | None = None
        self._ahead: tuple[tuple[int, int], Future] | None = None
        """The next shard's position and its layout, being read ahead."""
        self.process = process if process is not None else HelperProcess()
        self._empty_in_a_row = 0

    def shard_order(self, pass_index: int) -> list[int]:
        """Indices into ``urls`` in the order pass ``pass_index`` reads them."""
        if self.test:
            return list(self.shards)
        perm = seeded_rng(self.seed, self.stream, _SHARD_ORDER_TAG, pass_index).permutation(len(self.shards))
        return [self.shards[i] for i in perm.tolist()]

    def _plan(self, where: tuple[int, int]) -> LayoutPlan:
        """The layout of the shard at ``where`` = (pass, index into its order): a function of
        ``where`` alone, so it may be read ahead of the stream, in a thread or a process."""
        pass_index, shard_pos = where
        shard = self.shard_order(pass_index)[shard_pos]
        return LayoutPlan(
            url=self.urls[shard],
            vocab_size=self.vocab_size,
            stride=self.stride,
            expected=tuple(self.sizes[shard]) if self.sizes is not None else None,
            order_seed=None
            if self.test
            else (self.seed, self.stream, _SENTENCE_ORDER_TAG, pass_index, shard),
            reverse=self.reverse,
            endpoint=storage.endpoint_url(),
        )

    def _read(self, where: tuple[int, int]) -> WrappedSentences:
        return read_layout(self._plan(where), self.reader)

    def _following(self, where: tuple[int, int]) -> tuple[int, int] | None:
        """The position of the shard after ``where`` (None: the end of a test pass)."""
        if where[1] + 1 < len(self.shards):
            return where[0], where[1] + 1
        return None if self.test else (where[0] + 1, 0)

    def _read_ahead(self, where: tuple[int, int]) -> None:
        following = self._following(where)
        if self.prefetch is ReadAhead.off or following is None:
            return
        if self.prefetch is ReadAhead.thread:
            self._ahead = (following, in_thread(lambda: self._read(following), "shard-prefetch"))
            return
        self._ahead = (following, self.process.submit(read_layout, self._plan(following), self.reader))

    def _wait(self, future, where: tuple[int, int]) -> WrappedSentences:
        if self.prefetch is not ReadAhead.process:
            return future.result()
        what = f"with the sentences of {self._plan(where).url}"
        return self.process.wait(future, READ_AHEAD_TIMEOUT_S, what)

    def close(self) -> None:
        """End the read-ahead process, if one started (a later read ahead starts another)."""
        self._ahead = None
        self.process.close()

    def _load(self) -> WrappedSentences:
        where = (self.pass_index, self.shard_pos)
        if self._loaded is not None and self._loaded[0] == where:
            return self._loaded[1]
        # a read ahead for another position (the stream was moved by set_position) is dropped
        ahead, self._ahead = self._ahead, None
        wrapped = (
            self._wait(ahead[1], where) if ahead is not None and ahead[0] == where else self._read(where)
        )
        self._loaded = (where, wrapped)
        self._read_ahead(where)
        n = wrapped.n_sentences
        self._empty_in_a_row = 0 if n else self._empty_in_a_row + 1
        if not self.test and self._empty_in_a_row >= len(self.shards):
            raise ValueError(
                f"rank {self.rank} of {self.world_size}: its {len(self.shards)} shard(s) "
                f"({self.urls[self.shards[0]]}, ...) hold no sentences for it; the stream would never yield"
            )
        return wrapped

    def next_sentence(self) -> tuple[WrappedSentences, int, int] | None:
        """The next sentence as ``(layout, begin, end)``: its wrapped ids are
        ``layout.ids[begin:end]``. None when a test pass is over (training never ends)."""
        while True:
            if self.shard_pos == len(self.shards):
                if self.test:
                    return None
                self.pass_index, self.shard_pos, self.offset = self.pass_index + 1, 0, 0
            wrapped = self._load()
            if self.offset < wrapped.n_sentences:
                j = self.offset
                self.offset += 1
                return wrapped, wrapped.begin(j), int(wrapped.ends[j])
            self.shard_pos, self.offset = self.shard_pos + 1, 0

    def position(self) -> dict[str, int]:
        return {"pass": self.pass_index, "shard": self.shard_pos, "offset": self.offset}

    def set_position(self, position: dict[str, int]) -> None:
        self.pass_index, self.shard_pos, self.offset = position["pass"], position["shard"], position["offset"]
        if not 0 <= self.shard_pos <= len(self.shards):
            raise ValueError(
                f"data state: shard position {self.shard_pos} outside this rank's {len(self.shards)} shards"
            )

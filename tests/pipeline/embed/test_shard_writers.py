"""Writer processes (``shard_writers``): a shard committed by a writer is the shard the actor would
have committed itself, byte for byte; several commit at once; a writer maps each shared buffer
once and lets go of dropped ones; its errors come back as one line; a killed writer is named; and
writers stop with their actor, even one killed in the middle of a commit, leaving no partial file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from polling import wait_until

from pipeline.embed import shard_writers
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import chosen_format
from pipeline.embed.resume import commit_shard
from pipeline.embed.shard_vectors import BufferPool, ShardAssembler
from pipeline.embed.shard_writers import PARENT_POLL_S, ShardWriters

REPO = Path(__file__).parents[3]
PACKED = chosen_format("hdf5", "packed")
"""HDF5 shards in the packed layout: the format the writers get, bound once."""


def _shard(pool: BufferPool, first_line: int, sizes: list[int], row_shape=(8,), pooled=False, seed=0):
    """A shard of ``len(sizes)`` lines assembled on ``pool`` from random float16 pass outputs."""
    rng = np.random.default_rng(seed)
    lines = len(sizes)
    assembler = ShardAssembler(first_line, lines, range(lines), sizes, row_shape, np.float16, pooled, pool)
    order = rng.permutation(lines)  # a pass holds lines from anywhere in the shard
    rows = len(order) if pooled else int(np.asarray(sizes)[order].sum())
    assembler.place(order, rng.standard_normal((rows, *row_shape)).astype(np.float16))
    return assembler.finish()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
    wait_until(lambda: not any(_alive(p) for p in pids), f"writers {pids} gone", timeout_s)


def _mappings(pid: int) -> int:
    """The shared buffers a process has mapped."""
    with open(f"/proc/{pid}/maps") as f:
        return sum("elmo-shard-vectors" in line for line in f)


@pytest.fixture
def writers():
    pool = ShardWriters(2)
    yield pool
    pool.close()
    _wait_gone(pool.pids)


@pytest.mark.parametrize(
    ("file_format", "layout", "row_shape", "pooled"),
    [
        ("hdf5", "packed", (8,), False),
        ("hdf5", "packed", (3, 8), False),
        ("hdf5", "allennlp", (3, 8), False),
        ("hdf5", "packed", (8,), True),  # pooled: the lines' own array travels in the request
        ("parquet", "packed", (8,), False),
        ("parquet", "packed", (3, 8), True),
    ],
    ids=["packed-top", "packed-all", "allennlp-all", "packed-pooled", "parquet-top", "parquet-all-pooled"],
)
def test_a_writer_commits_the_bytes_and_entry_the_actor_would(
    writers, tmp_path, file_format, layout, row_shape, pooled
):
    pool = BufferPool(writers.buffers)
    shard = _shard(pool, 40, [3, 0, 5, 1, 7], row_shape, pooled)
    stats = {"index": 1, "sentences": 5}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()  # a run's claim makes its folder: a commit never does
    entry = writers.commit(str(tmp_path / "a"), stats, shard, chosen_format(file_format, layout))
    own = commit_shard(str(tmp_path / "b"), stats, shard, chosen_format(file_format, layout))
    assert entry == own and entry["name"] == f"embeddings-000001.{file_format}"
    assert (tmp_path / "a" / entry["name"]).read_bytes() == (tmp_path / "b" / entry["name"]).read_bytes()
    assert (tmp_path / "a/_progress").exists()
    pool.release(shard)


def test_several_writers_commit_at_once_each_shard_once(writers, tmp_path):
    pool = BufferPool(writers.buffers)
    sizes = [int(n) for n in np.random.default_rng(1).integers(0, 30, 200)]
    entries, errors = {}, []
    (tmp_path / "own").mkdir(), (tmp_path / "out").mkdir()

    def commit(index: int) -> None:
        try:
            shard = _shard(pool, 200 * index, sizes, seed=index)
            expected = commit_shard(str(tmp_path / "own"), {"index": index}, shard, PACKED)
            entries[index] = (
                writers.commit(str(tmp_path / "out"), {"index": index}, shard, PACKED),
                expected,
            )
            pool.release(shard)
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(entries) == list(range(8))
    assert all(got == expected for got, expected in entries.values())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_progress",
        *(f"embeddings-{i:06d}.hdf5" for i in range(8)),
    ]
    assert len(list((tmp_path / "out/_progress").iterdir())) == 8


def test_a_writer_maps_a_buffer_once_and_lets_go_of_dropped_ones(tmp_path):
    writers = ShardWriters(1)
    try:
        (pid,) = writers.pids
        pool = BufferPool(writers.buffers)
        for index in range(3):  # one buffer, reused: mapped once
            shard = _shard(pool, 0, [4, 4], seed=index)
            writers.commit(str(tmp_path), {"index": index}, shard, PACKED)
            pool.release(shard)
        assert _mappings(pid) == 1 and len(writers.buffers.live()) == 1
        del shard  # the last view of the small buffer
        larger = _shard(pool, 0, [400, 400])  # too large: the pool drops the old buffer for a new one
        writers.commit(str(tmp_path), {"index": 3}, larger, PACKED)
        assert _mappings(pid) == 1 and len(writers.buffers.live()) == 1
        pool.release(larger)
    finally:
        writers.close()


def test_a_writers_error_comes_back_as_one_line_and_it_serves_on(writers, tmp_path):
    pool = BufferPool(writers.buffers)
    shard = _shard(pool, 0, [2, 2])
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(EmbedError, match=r"^\S*a-file/embeddings-000000\.hdf5: .*$") as err:
        writers.commit(str(blocked), {"index": 0}, shard, PACKED)
    assert "\n" not in str(err.value)
    (tmp_path / "out").mkdir()
    assert writers.commit(str(tmp_path / "out"), {"index": 0}, shard, PACKED)["index"] == 0
    # both writers have served (and are ready); a Ctrl-C is not theirs to act on: they are not in
    # the job's process group, and ignore one sent to them
    for pid in writers.pids:
        assert os.getsid(pid) == os.getpgid(pid) == pid
        os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    for index in range(1, 3):  # both writers still there
        assert writers.commit(str(tmp_path / "out"), {"index": index}, shard, PACKED)["index"] == index
    pool.release(shard)


@pytest.fixture
def one_writer():
    """``(writers, pool, shard, pid)``: one writer process and a two-line shard on its buffers."""
    writers = ShardWriters(1)
    try:
        pool = BufferPool(writers.buffers)
        shard = _shard(pool, 0, [2, 2])
        yield writers, pool, shard, writers.pids[0]
        pool.release(shard)
    finally:
        writers.close()


def test_a_killed_writer_is_named_and_its_shard_left_to_the_rerun(tmp_path, one_writer):
    writers, _, shard, pid = one_writer
    os.kill(pid, signal.SIGKILL)
    message = (
        rf"^the writer process of shard 3 \(pid {pid}\) was killed by signal 9 before committing it; rerun"
    )
    with pytest.raises(EmbedError, match=message):
        writers.commit(str(tmp_path), {"index": 3}, shard, PACKED)
    assert not tmp_path.joinpath("_progress").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bound", ["stopped", "limit"])
def test_a_writer_that_does_not_answer_is_ended_and_named(tmp_path, monkeypatch, bound, one_writer):
    """Issue 65, item 2: a SIGSTOPped writer (or one blocked in the kernel) held the embed for ever,
    silently. Stopped, it is ended after ``STOPPED_S``; in any state, past the commit's limit."""
    monkeypatch.setattr(shard_writers, "POLL_S", 0.05)
    if bound == "stopped":
        monkeypatch.setattr(shard_writers, "STOPPED_S", 0.5)
    else:  # never ended for being stopped: the limit ends it
        monkeypatch.setattr(shard_writers, "STOPPED_S", 3600.0)
        monkeypatch.setattr(shard_writers, "ANSWER_MIN_S", 1.0)
    writers, _, shard, pid = one_writer
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    message = rf"^the writer process of shard 3 \(pid {pid}, stopped by a signal\) did not answer within \d+ s; it was ended; rerun"
    with pytest.raises(EmbedError, match=message) as err:
        writers.commit(str(tmp_path), {"index": 3}, shard, PACKED)
    assert time.monotonic() - started < 5.0 and "\n" not in str(err.value)
    assert not _alive(pid)  # ended, not left stopped
    assert not tmp_path.joinpath("_progress").exists()


ACTOR = """
import sys, threading
import numpy as np
from pipeline.embed.shard_vectors import BufferPool, ShardAssembler
from pipeline.embed.file_format import chosen_format
from pipeline.embed.shard_writers import ShardWriters

writers = ShardWriters(2)
print(*writers.pids, flush=True)
pool = BufferPool(writers.buffers)
sizes = [500] * 1000  # 500,000 tokens of 1024 float16: a 1 GB shard, long enough to be caught writing
assembler = ShardAssembler(0, len(sizes), range(len(sizes)), sizes, (1024,), np.float16, False, pool)
assembler.rows[:] = 1
shard = assembler.finish()
print("committing", flush=True)
writers.commit(sys.argv[1], {"index": 0}, shard, chosen_format("hdf5", "packed"))
print("committed", flush=True)
"""


@pytest.mark.subprocess
def test_writers_stop_when_their_actor_is_killed_mid_commit_leaving_no_partial_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    actor = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(ACTOR), str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(p) for p in actor.stdout.readline().split()]
        assert actor.stdout.readline().strip() == "committing"
        partial = lambda: list(out.glob(".embeddings-000000.hdf5.*"))  # noqa: E731
        wait_until(lambda: partial() or actor.poll() is not None, "the writer writing", 60, every_s=0.005)
        assert partial(), "the writer was never seen writing"
        actor.kill()  # SIGKILL: the actor cannot tell its writers anything
        actor.wait()
        _wait_gone(pids, timeout_s=10 * PARENT_POLL_S + 5)
        assert list(out.iterdir()) == []  # the partial file discarded, no shard, no entry
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait()


def test_the_writers_import_neither_torch_nor_ray():
    code = "import sys, pipeline.embed.shard_writers; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

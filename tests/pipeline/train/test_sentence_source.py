"""One direction's sentences for one rank (pipeline/train/sentence_source.py): shard and sentence
orders per pass and direction, the rank split, and the next shard read ahead in a thread or a helper
process (its failures named where the shard is needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from train_shards import fixture_vocab, many_shards_dir, source_sentences, word_ids

from pipeline.formats import shard_format
from pipeline.formats.shard_format import BOS_ID, EOS_ID
from pipeline.formats.shard_manifest import read_manifest
from pipeline.train.sentence_source import ReadAhead, SentenceSource, rank_sentence_count
from pipeline.train.shard_reading import read_shard_sentences


@pytest.fixture(scope="module")
def vocab():
    return fixture_vocab()


def test_training_passes_shuffle_each_pass_and_direction(tmp_path, vocab):
    all_sentences = many_shards_dir(str(tmp_path), vocab)
    urls = read_manifest(str(tmp_path)).urls("train")

    def source(**kw):
        return SentenceSource(urls, len(vocab), **kw)

    n = len(all_sentences)
    fwd = source_sentences(source(seed=1), 2 * n)
    expected = sorted(tuple([BOS_ID, *word_ids(s, vocab), EOS_ID]) for s in all_sentences)
    assert sorted(fwd[:n]) == expected and sorted(fwd[n:]) == expected  # each sentence once per pass
    assert fwd[:n] != fwd[n:]  # a fresh order each pass
    assert source_sentences(source(seed=1), 2 * n) == fwd  # seeded
    assert source_sentences(source(seed=2), n) != fwd[:n]
    bwd = source_sentences(source(seed=1, stream=1, reverse=True), n)
    assert sorted(bwd) == sorted(s[::-1] for s in expected)
    assert [s[::-1] for s in bwd] != fwd[:n]  # the reversed stream shuffles independently
    test = source_sentences(source(test=True), n + 1)
    assert (
        test[:n] == [tuple([BOS_ID, *word_ids(s, vocab), EOS_ID]) for s in all_sentences] and test[n] is None
    )


@pytest.mark.parametrize("n_shards,world_size", [(3, 2), (4, 2), (1, 2), (2, 3)])
def test_rank_subsets_are_disjoint_and_cover_the_split(tmp_path, vocab, n_shards, world_size):
    all_sentences = many_shards_dir(str(tmp_path), vocab, n_shards=n_shards)
    urls = read_manifest(str(tmp_path)).urls("train")
    counts = [e.sentences for e in read_manifest(str(tmp_path)).shards["train"]]
    seen = []
    for rank in range(world_size):
        got = source_sentences(
            SentenceSource(urls, len(vocab), rank=rank, world_size=world_size, test=True),
            len(all_sentences) + 1,
        )
        got = [s for s in got if s is not None]
        assert got, f"rank {rank} got no sentences"
        assert len(got) == rank_sentence_count(counts, rank, world_size)  # what the pre-flight checks use
        seen += got
    assert sorted(seen) == sorted(tuple([BOS_ID, *word_ids(s, vocab), EOS_ID]) for s in all_sentences)


def test_the_next_shard_is_decoded_in_another_process_that_close_ends(tmp_path, vocab):
    many_shards_dir(str(tmp_path), vocab)
    urls = read_manifest(str(tmp_path)).urls("train")
    source = SentenceSource(urls, len(vocab), test=True)
    source.next_sentence()
    worker = source.process.pid
    assert worker is not None and worker != os.getpid() and _alive(worker)
    layout = source._ahead[1].result()  # the second shard, laid out there and sent back
    expected = SentenceSource(urls, len(vocab), test=True, prefetch=ReadAhead.off)._read((0, 1))
    np.testing.assert_array_equal(layout.ids, expected.ids)
    np.testing.assert_array_equal(layout.ends, expected.ends)
    source.close()
    assert not _alive(worker) and source.process.pid is None


def test_the_read_ahead_process_ends_when_its_parent_is_killed():
    # a Ray worker can be SIGKILLed: its read-ahead process must not outlive it
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal\n"
            "from pipeline.runtime.background import HelperProcess\n"
            "print(HelperProcess().submit(os.getpid).result(), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert parent.returncode == -signal.SIGKILL
    child = int(parent.stdout)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie (exited, not yet reaped) has ended."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


class RecordingReader:
    """``read_shard_sentences`` that records which thread read which shard, and fails on ``fail``."""

    def __init__(self, fail: str | None = None):
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def __call__(self, url, *args):
        self.calls.append((url.rsplit("/", 1)[-1], threading.current_thread().name))
        if url == self.fail:
            raise shard_format.FormatError(f"shard {url}: broken")
        return read_shard_sentences(url, *args)


def test_the_next_shard_is_read_in_a_thread_when_a_shard_starts(tmp_path, vocab):
    many_shards_dir(str(tmp_path), vocab)
    urls = read_manifest(str(tmp_path)).urls("train")
    reader = RecordingReader()
    source = SentenceSource(urls, len(vocab), test=True, reader=reader, prefetch=ReadAhead.thread)
    source.next_sentence()
    source._ahead[1].result()  # the read ahead has finished
    names = [u.rsplit("/", 1)[-1] for u in urls]
    assert reader.calls == [(names[0], threading.current_thread().name), (names[1], "shard-prefetch")]
    source_sentences(source, 7)  # into the second shard: the third is read ahead, nothing read twice
    source._ahead[1].result()
    assert [name for name, _ in reader.calls] == names
    assert source_sentences(source, 20)[-1] is None and len(reader.calls) == 3  # no read past a test pass


def test_a_failed_read_ahead_raises_where_its_shard_is_needed(tmp_path, vocab):
    many_shards_dir(str(tmp_path), vocab)
    urls = read_manifest(str(tmp_path)).urls("train")
    source = SentenceSource(
        urls, len(vocab), test=True, reader=RecordingReader(fail=urls[1]), prefetch=ReadAhead.thread
    )
    assert None not in source_sentences(source, 7)  # the whole first shard, though its successor failed
    with pytest.raises(shard_format.FormatError, match="train-000001.tar: broken"):
        source.next_sentence()


def test_a_stopped_read_ahead_process_is_named_not_waited_for_forever(tmp_path, vocab, monkeypatch):
    from pipeline.runtime.child_process import HelperProcessError
    from pipeline.train import sentence_source

    monkeypatch.setattr(sentence_source, "READ_AHEAD_TIMEOUT_S", 2.0)
    many_shards_dir(str(tmp_path), vocab)
    urls = read_manifest(str(tmp_path)).urls("train")
    source = SentenceSource(urls, len(vocab), test=True)
    source.next_sentence()  # the first shard read here; the second one is asked of the helper
    source.process.close()  # that answer may be in already: ask again, and stop the new helper at once
    source._read_ahead((0, 0))
    helper = source.process.pid
    os.kill(helper, signal.SIGSTOP)
    try:
        with pytest.raises(HelperProcessError) as err:
            while True:
                source.next_sentence()
        assert str(err.value) == (
            f"the helper process {helper} (stopped by a signal) did not answer with the sentences of "
            f"{urls[1]} within 2 s; it was ended"
        )
        assert source.process.pid is None
    finally:
        if _alive(helper):
            os.kill(helper, signal.SIGKILL)

"""The collectives between ranks: summing and exchanging softmax row gradients, against a dense
all-reduce on two gloo processes."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.train.distributed import dense_allreduce_mean, exchange_rows, merge_rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_rows(rank: int, rows: int, vocab: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` ids with repeats (drawn from a small range) and their gradients."""
    gen = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, min(vocab, rows), (rows,), generator=gen) * (vocab // min(vocab, rows))
    return ids, torch.randn(rows, dim, generator=gen)


def _dense(ids, values, vocab):
    return torch.zeros(vocab, values.shape[1]).index_add_(0, ids, values)


def _worker(rank: int, world: int, port: int, cases: list, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = []
        for rows, vocab, dim in cases:
            ids, values = _rank_rows(rank, rows, vocab, dim)
            sparse, received = exchange_rows(ids, values, vocab)
            dense = _dense(ids, values, vocab)
            dense_bytes = dense_allreduce_mean(dense)
            out.append((sparse.to_dense(vocab), dense, received, dense_bytes, sparse.ids, sparse.valid))
        torch.save(out, os.path.join(out_dir, f"rank-{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory):
    # results come back through files, not a multiprocessing.Manager: its server process is forked
    # from this one, and a fork of a process that drives Ray breaks Ray's GCS connection when it exits
    cases = [(50, 1000, 5), (100, 1000, 5), (50, 100_000, 5)]
    out_dir = str(tmp_path_factory.mktemp("exchange"))
    mp.start_processes(
        _worker, args=(2, _free_port(), cases, out_dir), nprocs=2, join=True, start_method="spawn"
    )
    return {
        rank: torch.load(os.path.join(out_dir, f"rank-{rank}.pt"), weights_only=True) for rank in range(2)
    }, cases


def test_sparse_exchange_equals_dense_allreduce(exchanged):
    results, cases = exchanged
    for rank in range(2):
        for (rows, _, _), (sparse_dense, dense, _, _, ids, valid) in zip(cases, results[rank], strict=True):
            torch.testing.assert_close(sparse_dense, dense, rtol=1e-6, atol=1e-6)
            assert ids.shape == (2 * rows,)  # fixed slots: world x K
            count = int(valid.sum())
            assert bool(valid[:count].all()) and not bool(valid[count:].any())
            assert bool((ids[1:count] > ids[: count - 1]).all())
            assert count == int((dense.abs().sum(dim=1) > 0).sum())
    # both ranks hold the same averaged gradient
    for a, b in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(a[0], b[0])


def test_exchanged_bytes_scale_with_rows_not_vocabulary(exchanged):
    results, _ = exchanged
    small, double, big_vocab = results[0]
    assert big_vocab[2] == small[2]  # 100x the vocabulary, same rows: same bytes
    assert double[2] == 2 * small[2]  # twice the rows: twice the bytes
    assert big_vocab[3] > 100 * big_vocab[2]  # a dense all-reduce moves the whole matrix


def test_single_process_exchange_sums_repeats_in_fixed_slots():
    ids, values = torch.tensor([5, 1, 5, 3, 1]), torch.arange(10.0).view(5, 2)
    out, received = exchange_rows(ids, values, 8)
    assert received == 0
    assert out.ids.shape == (5,) and int(out.count()) == 3
    assert out.ids[:3].tolist() == [1, 3, 5] and out.valid.tolist() == [True, True, True, False, False]
    torch.testing.assert_close(
        out.values[:3], torch.tensor([[2.0 + 8, 3.0 + 9], [6.0, 7.0], [0.0 + 4, 1.0 + 5]])
    )
    assert float(out.values[3:].abs().sum()) == 0 and out.ids[3:].tolist() == [0, 0]
    torch.testing.assert_close(out.to_dense(8), _dense(ids, values, 8))


def test_merge_marks_the_vocabulary_size_as_an_empty_slot():
    out = merge_rows(torch.tensor([4, 4, 2]), torch.ones(3, 1), vocab_size=4)
    assert out.ids.tolist() == [2, 0, 0] and out.valid.tolist() == [True, False, False]
    assert out.values[:, 0].tolist() == [1.0, 0.0, 0.0]

"""The sparse softmax exchange against a dense all-reduce, on two gloo processes."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.train.softmax_exchange import RowGradient, dense_allreduce_mean, exchange_rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_rows(rank: int, rows: int, vocab: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    ids = torch.randperm(vocab, generator=gen)[:rows]
    return ids, torch.randn(rows, dim, generator=gen)


def _worker(rank: int, world: int, port: int, cases: list, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = []
        for rows, vocab, dim in cases:
            ids, values = _rank_rows(rank, rows + 7 * rank, vocab, dim)
            sparse, received = exchange_rows(ids, values)
            dense = RowGradient(*_sorted(ids, values)).to_dense(vocab)
            dense_bytes = dense_allreduce_mean(dense)
            out.append((sparse.to_dense(vocab), dense, received, dense_bytes, sparse.ids))
        torch.save(out, os.path.join(out_dir, f"rank-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _sorted(ids, values):
    order = torch.argsort(ids)
    return ids[order], values[order]


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory):
    # results come back through files, not a multiprocessing.Manager: its server process is forked
    # from this one, and a fork of a process that drives Ray breaks Ray's GCS connection when it exits
    cases = [(50, 1000, 5), (100, 1000, 5), (50, 100_000, 5)]
    out_dir = str(tmp_path_factory.mktemp("exchange"))
    mp.start_processes(
        _worker, args=(2, _free_port(), cases, out_dir), nprocs=2, join=True, start_method="spawn"
    )
    return {rank: torch.load(os.path.join(out_dir, f"rank-{rank}.pt")) for rank in range(2)}, cases


def test_sparse_exchange_equals_dense_allreduce(exchanged):
    results, cases = exchanged
    for rank in range(2):
        for sparse_dense, dense, _, _, ids in results[rank]:
            torch.testing.assert_close(sparse_dense, dense, rtol=1e-6, atol=1e-7)
            assert bool((ids[1:] > ids[:-1]).all())
    # both ranks hold the same averaged gradient
    for a, b in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(a[0], b[0])


def test_exchanged_bytes_scale_with_rows_not_vocabulary(exchanged):
    results, _ = exchanged
    small, double, big_vocab = results[0]
    assert big_vocab[2] == small[2]  # 100x the vocabulary, same rows: same bytes
    assert 1.8 < double[2] / small[2] < 2.1  # twice the rows: about twice the bytes
    assert big_vocab[3] > 100 * big_vocab[2]  # a dense all-reduce moves the whole matrix


def test_single_process_exchange_is_identity():
    ids, values = torch.tensor([5, 1, 3]), torch.randn(3, 4)
    out, received = exchange_rows(ids, values)
    assert received == 0
    assert out.ids.tolist() == [1, 3, 5]
    torch.testing.assert_close(out.values, values[[1, 2, 0]])


def test_row_gradient_to_sparse_matches_dense():
    grad = RowGradient(torch.tensor([0, 4]), torch.arange(8.0).view(2, 4))
    weight, bias = grad.to_sparse(6)
    dense = grad.to_dense(6)
    torch.testing.assert_close(weight.to_dense(), dense[:, :3])
    torch.testing.assert_close(bias.to_dense(), dense[:, 3])

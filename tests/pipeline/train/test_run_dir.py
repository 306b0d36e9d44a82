"""The run directory (pipeline/train/run_dir.py): every path a run writes, local and s3://, and the
RunWriter that carries a rank's background writes there."""

from __future__ import annotations

import threading

import pytest

from pipeline.train.run_dir import RunDir, RunWriter


@pytest.mark.parametrize("root", ["/runs/kjv", "s3://bucket/runs/kjv"])
def test_every_path_of_the_run_directory(root):
    run = RunDir(root)
    assert [run.run_file, run.lease, run.metrics, run.plot] == [
        f"{root}/run.json",
        f"{root}/lease.json",
        f"{root}/metrics.jsonl",
        f"{root}/perplexity.png",
    ]
    assert run.checkpoint(1250) == f"{root}/checkpoints/step-000001250"
    assert run.checkpoint(1250).startswith(run.checkpoints + "/")
    assert [run.wandb, run.export] == [f"{root}/wandb", f"{root}/export"]
    assert run.is_s3 == root.startswith("s3://")


def test_the_end_of_a_run_waits_for_both_queues_and_raises_a_failed_write():
    writer, gate, done = RunWriter(), threading.Event(), []
    writer.checkpoints.submit(lambda: (gate.wait(10), done.append("checkpoint")))
    writer.records.submit(lambda: done.append("row"))
    writer.records.wait()
    assert done == ["row"]  # a slow checkpoint does not hold back the record
    gate.set()

    def broken():
        raise OSError("connection reset")

    writer.records.submit(broken)
    with pytest.raises(OSError, match="connection reset"):
        writer.close()
    assert done == ["row", "checkpoint"]

"""Replaying a static-shape step as a CUDA graph (elmo_model/cuda_graph.py). CUDA only: the GPU
sessions run these (``pytest -m cuda``); the training step's and static inference's own tests
cover the callers."""

from __future__ import annotations

import pytest
import torch

from elmo_model.cuda_graph import GraphedStep

pytestmark = pytest.mark.cuda


def test_a_step_runs_eagerly_then_replays_its_graph_on_new_inputs():
    x = torch.zeros(4, device="cuda")
    w = torch.full((4,), 2.0, device="cuda")
    traced = []

    def fn():
        traced.append(1)  # Python runs only in the eager calls and the capture
        return {"y": x * w + 1}

    step = GraphedStep(fn, warmup=2)
    for i in range(6):
        x.copy_(torch.full((4,), float(i), device="cuda"))  # inputs go into the fixed buffer
        assert step()["y"].tolist() == [2.0 * i + 1] * 4
    assert step.replaying and step.captures == 1
    assert len(traced) == 3  # 2 eager warm-ups, 1 capture; the last 3 calls replayed

    step.reset()  # the static buffers changed: warm up and capture again
    assert not step.replaying
    for _ in range(3):
        assert step()["y"].tolist() == [2.0 * 5 + 1] * 4
    assert step.captures == 2 and len(traced) == 6


def test_steps_that_never_run_at_once_can_share_a_warm_up_stream():
    stream = torch.cuda.Stream()
    a = GraphedStep(lambda: {"y": torch.ones(2, device="cuda")}, warmup=1, stream=stream)
    b = GraphedStep(lambda: {"y": torch.zeros(2, device="cuda")}, warmup=1, stream=stream)
    assert a.stream is b.stream is stream
    for _ in range(3):
        assert a()["y"].tolist() == [1.0, 1.0] and b()["y"].tolist() == [0.0, 0.0]
    assert a.replaying and b.replaying

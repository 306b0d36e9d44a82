"""Embed tests: one torch thread in the test process (the tiny model runs ~30x slower with two
threads fighting over two shared cores)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

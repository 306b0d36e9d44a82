"""Fixtures for the elmo_model tests."""

from __future__ import annotations

import pytest
import torch
from elmo_reference import TINY_OPTIONS, ReferenceSet

from elmo_model import BiLM


@pytest.fixture(params=["bilm_tf", "allennlp"])
def reference(request) -> ReferenceSet:
    return ReferenceSet(request.param)


@pytest.fixture
def allennlp_reference() -> ReferenceSet:
    return ReferenceSet("allennlp")


@pytest.fixture
def tiny_model() -> BiLM:
    """A small randomly initialised model (eval mode) with skips, 1 highway, 3 filters."""
    torch.manual_seed(0)
    return BiLM.from_options(TINY_OPTIONS).eval()


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """Every test here runs with one torch thread (``single_thread`` in tests/conftest.py)."""
    yield

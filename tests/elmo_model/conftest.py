"""Fixtures for the elmo_model tests."""

from __future__ import annotations

import sys
from pathlib import Path

# pytest's prepend import mode puts tests/ on sys.path (the rootdir conftest), where the directory
# tests/elmo_model would shadow the real package as an empty namespace package. Make the repo
# root win (the proper fix is `pythonpath = ["."]` in the pytest config).
_ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)
if getattr(sys.modules.get("elmo_model"), "__file__", "") is None:
    for _name in [n for n in sys.modules if n == "elmo_model" or n.startswith("elmo_model.")]:
        del sys.modules[_name]

import pytest  # noqa: E402
import torch  # noqa: E402
from elmo_reference import TINY_OPTIONS, ReferenceSet  # noqa: E402

from elmo_model import BiLM  # noqa: E402


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
def single_thread():
    """The test models are tiny: one thread avoids stalls when other processes share the cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

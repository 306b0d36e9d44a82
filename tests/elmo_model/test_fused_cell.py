"""The Triton cell kernel (elmo_model/fused_cell.py), run by Triton's CPU interpreter.

On a GPU machine the same kernel is compiled; benchmarks/gpu_check.py covers that case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

pytest.importorskip("triton", reason="Triton is not installed (the fused cell is CUDA-only)")

CHECKS = Path(__file__).with_name("fused_cell_checks.py")
ROOT = Path(__file__).resolve().parents[2]


def test_fused_cell_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(CHECKS)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fused cell checks passed" in done.stdout


def test_cpu_tensors_use_the_plain_cell_without_interpreter():
    import torch

    from elmo_model.lstm import fused_cell_for

    assert fused_cell_for(torch.zeros(2, 1, 4)) is None


def test_cpu_forward_never_imports_triton():
    """Triton is imported on first CUDA use only: CPU processes (Ray workers) skip its import cost."""
    code = (
        "import sys, torch; from elmo_model import BiLM, batch_to_ids;"
        "sys.path.insert(0, 'tests/elmo_model'); from elmo_reference import TINY_OPTIONS;"
        "BiLM.from_options(TINY_OPTIONS).eval()(batch_to_ids([['a', 'b']]));"
        "print('triton' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"

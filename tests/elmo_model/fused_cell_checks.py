"""Checks of elmo_model.fused_cell run under TRITON_INTERPRET=1 (a subprocess of test_fused_cell.py).

Triton reads the interpreter flag when the kernel is defined, i.e. when elmo_model is first imported,
so these run in a fresh interpreter. Each check prints one line; any failure raises.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elmo_reference import ReferenceSet, assert_matches_reference, run_stateful  # noqa: E402

from elmo_model import BiLM, batch_to_ids  # noqa: E402
from elmo_model.fused_cell import fused_cell_step  # noqa: E402
from elmo_model.lstm import fused_cell_for  # noqa: E402


def reference_step(gates: torch.Tensor, c: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The cell in float64 from the same (possibly bf16) gates: (c, m)."""
    i, f, o, j = gates.double().chunk(4, dim=-1)
    c = (torch.sigmoid(f) * c.double() + torch.sigmoid(i) * torch.tanh(j)).clamp(-clip, clip)
    return c, torch.sigmoid(o) * torch.tanh(c)


def check_step() -> None:
    """Strided slices of larger buffers, odd sizes, both dtypes; nothing outside the slices changes."""
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        dim, rows = 37, 5
        big_gates = (torch.randn(2, 9, 4 * dim) * 3).to(dtype)
        big_c = torch.randn(2, 7, dim) * 4
        before_gates, before_c = big_gates.clone(), big_c.clone()
        gates, c = big_gates[:, 2 : 2 + rows], big_c[:, :rows]
        want_c, want_m = reference_step(gates.clone(), c.clone(), 3.0)
        assert fused_cell_for(gates) is fused_cell_step
        m = fused_cell_step(gates, c, 3.0)
        assert m.dtype == dtype and m.shape == (2, rows, dim)
        err_c = (c.double() - want_c).abs().max().item()
        err_m = (m.double() - want_m).abs().max().item()
        assert err_c < 1e-5 and err_m < tol, (dtype, err_c, err_m)
        assert c.abs().max() <= 3.0
        assert torch.equal(big_c[:, rows:], before_c[:, rows:])
        assert torch.equal(big_gates[:, :2], before_gates[:, :2])
        assert torch.equal(big_gates[:, 2 + rows :], before_gates[:, 2 + rows :])
        # The i, f, o blocks are read, not written.
        assert torch.equal(gates[..., : 3 * dim], before_gates[:, 2 : 2 + rows, : 3 * dim])
        print(f"step {dtype}: max error c {err_c:.1e} m {err_m:.1e}")


def check_model_paths() -> None:
    """The fused and unfused no-grad paths agree, and both fixture sets reproduce through the fused one."""
    for name in ("bilm_tf", "allennlp"):
        reference = ReferenceSet(name)
        assert_matches_reference(run_stateful(reference.load(), reference.sentences()), reference)
        model = reference.load()
        ids = batch_to_ids([s for row in reference.sentences() for s in row[:2]])
        with torch.no_grad():
            fused = model(ids).layers
            model.lstm.use_fused_cell = False
            plain = model(ids).layers
        err = (fused - plain).abs().max().item()
        assert np.isfinite(err) and err < 2e-6, err
        print(f"{name}: fixtures reproduce through the fused cell; fused vs unfused {err:.1e}")


if __name__ == "__main__":
    assert BiLM is not None
    check_step()
    check_model_paths()
    print("fused cell checks passed")

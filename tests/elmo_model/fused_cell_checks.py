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
from elmo_model.fused_cell import cell_backward, cell_forward, fused_cell_step  # noqa: E402
from elmo_model.lstm import LSTMState, StackedBiLSTM, fused_cell_for  # noqa: E402


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


def check_forward_out_of_place() -> None:
    """The training form: gates are read, not written; c and m go to their own strided buffers."""
    torch.manual_seed(1)
    dim, rows = 19, 4
    gates = torch.randn(2, rows, 3, 4 * dim)[:, :, 1] * 3  # strided rows
    c_in = torch.randn(2, rows, 2, dim)[:, :, 0] * 4
    c_out = torch.full((2, rows, 5, dim), 7.0)[:, :, 2]
    m_out = torch.full((2, rows, dim), 7.0)
    before = gates.clone(), c_in.clone()
    cell_forward(gates, c_in, c_out, m_out, 3.0)
    want_c, want_m = reference_step(gates, c_in, 3.0)
    assert torch.equal(gates, before[0]) and torch.equal(c_in, before[1])
    err = max((c_out.double() - want_c).abs().max().item(), (m_out.double() - want_m).abs().max().item())
    assert err < 1e-5, err
    print(f"forward out of place: max error {err:.1e}")


def check_backward() -> None:
    """cell_backward against autograd through the float64 cell, with and without the clip and a
    gradient of c, for float32 and bf16 gates; dc_prev may overwrite dc."""
    torch.manual_seed(2)
    dim, rows = 23, 6
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for clip in (None, 1.5):
            for with_dc in (False, True):
                gates = (torch.randn(2, rows, 4 * dim) * 2).to(dtype)
                c_prev = torch.randn(2, rows, dim) * 2
                dm = torch.randn(2, rows, dim).to(dtype)
                dc = torch.randn(2, rows, dim) if with_dc else None
                g64 = gates.double().requires_grad_()
                c64 = c_prev.double().requires_grad_()
                i, f, o, j = g64.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c64 + torch.sigmoid(i) * torch.tanh(j)
                if clip is not None:
                    c = c.clamp(-clip, clip)
                m = torch.sigmoid(o) * torch.tanh(c)
                loss = (m * dm.double()).sum() + ((c * dc.double()).sum() if with_dc else 0)
                want_g, want_c = torch.autograd.grad(loss, [g64, c64])
                dgates = torch.full_like(gates, 9.0)
                dc_prev = dc if with_dc else torch.full_like(c_prev, 9.0)
                cell_backward(gates, c_prev, dc, dm, dgates, dc_prev, clip)
                err_g = ((dgates.double() - want_g).norm() / want_g.norm()).item()
                err_c = ((dc_prev.double() - want_c).norm() / want_c.norm()).item()
                assert err_g < tol and err_c < tol, (dtype, clip, with_dc, err_g, err_c)
                print(
                    f"backward {dtype} clip {clip} dc {with_dc}: relative error dgates {err_g:.1e} dc {err_c:.1e}"
                )


def check_window() -> None:
    """The training layer op with the kernels equals it with the torch cell: values and gradients."""
    torch.manual_seed(3)
    lstm = StackedBiLSTM(2, 8, 16, 8, cell_clip=1.0, proj_clip=1.0, use_skip_connections=True)
    inputs = torch.randn(2, 3, 6, 8, requires_grad=True)
    state = LSTMState(torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 8))
    results = []
    for fused in (True, False):
        lstm.use_fused_cell = fused
        top, final = lstm.forward_window(inputs, state)
        loss = (top * torch.linspace(-1, 1, top.numel()).view_as(top)).sum() + final.c.sum()
        results.append((top, final.c, *torch.autograd.grad(loss, [inputs, *lstm.parameters()])))
    err = max(
        (a - b).abs().max().item() / (b.abs().max().item() + 1e-12) for a, b in zip(*results, strict=True)
    )
    assert err < 1e-5, err
    print(f"training window: kernels vs torch cell, max relative error {err:.1e}")


def shortest(reference: ReferenceSet, count: int) -> list[list[str]]:
    """The set's ``count`` shortest sentences: the interpreter's time grows with a batch's length."""
    return sorted((s for row in reference.sentences() for s in row), key=len)[:count]


def check_model_paths() -> None:
    """One fixture set reproduces through the fused cell (stateful, its first 3 batches: the 2nd and
    3rd start from carried state); on the other, the fused and unfused no-grad paths agree. The two
    sets differ only in skip connections, which sit outside the cell. The interpreter runs a batch in
    ~2.8 s, so all 10 batches of both sets are left to benchmarks/gpu_check.py, which runs them
    through the compiled kernels on a GPU (the torch cell runs all 10 in test_reference_fixtures.py)."""
    reference = ReferenceSet("allennlp")
    actual = run_stateful(reference.load(), reference.sentences(), batches=3)
    assert_matches_reference(actual, reference, batches=3)
    print("allennlp: fixtures' first 3 batches reproduce through the fused cell")
    reference = ReferenceSet("bilm_tf")
    model = reference.load()
    ids = batch_to_ids(shortest(reference, 6))
    with torch.no_grad():
        fused = model(ids).layers
        model.lstm.use_fused_cell = False
        plain = model(ids).layers
    err = (fused - plain).abs().max().item()
    assert np.isfinite(err) and err < 2e-6, err
    print(f"bilm_tf: fused vs unfused {err:.1e}")


def check_static_inference() -> None:
    """Static-shape passes through the fused cell equal the torch cell (fixed shapes, bf16 too)."""
    from elmo_model.static_batches import BucketPlan, build_batch
    from elmo_model.static_inference import OutputSpec, StaticInference

    reference = ReferenceSet("bilm_tf")
    model = reference.load()
    batch = build_batch(shortest(reference, 3), BucketPlan(token_budget=256, max_rows=4, fixed=True))
    for precision, limit in (("float32", 2e-6), ("bf16", 2e-2)):
        run = StaticInference(model, OutputSpec("all"), precision)
        model.lstm.use_fused_cell = True
        fused = run(batch)
        model.lstm.use_fused_cell = False
        plain = run(batch)
        err = (fused - plain).abs().max().item()
        assert np.isfinite(err) and err < limit, (precision, err)
        print(f"static inference ({precision}): fused vs torch cell {err:.1e}")
    model.lstm.use_fused_cell = True


if __name__ == "__main__":
    assert BiLM is not None
    check_step()
    check_forward_out_of_place()
    check_backward()
    check_window()
    check_model_paths()
    check_static_inference()
    print("fused cell checks passed")

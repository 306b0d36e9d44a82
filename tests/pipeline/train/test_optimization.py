import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.train.config import LRRule, OptimizerConfig, OptimizerName, Schedule
from pipeline.train.optimization import (
    adagrad_rows_,
    apply_update,
    build_optimizer,
    clip_scale,
    global_norm,
    lr_factor,
    peak_lr,
)

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[3]


def test_lr_schedules():
    assert lr_factor(5, 100, Schedule.constant, 0, 0.0) == 1.0
    assert lr_factor(0, 100, Schedule.constant, 10, 0.0) == pytest.approx(0.1)
    assert lr_factor(9, 100, Schedule.linear, 10, 0.0) == pytest.approx(1.0)
    assert lr_factor(100, 100, Schedule.linear, 0, 0.1) == pytest.approx(0.1)
    assert lr_factor(50, 100, Schedule.cosine, 0, 0.0) == pytest.approx(0.5)


def test_the_gpu_rule_scales_bilm_tfs_rate_by_the_square_root_of_the_global_batch():
    recipe = OptimizerConfig(lr=0.2)
    assert peak_lr(recipe, 384, cuda=True) == pytest.approx(0.2)  # bilm-tf: 3 GPUs x 128 rows
    assert peak_lr(recipe, 128, cuda=True) == pytest.approx(0.2 / math.sqrt(3))  # one GPU
    assert peak_lr(recipe, 8 * 128, cuda=True) == pytest.approx(0.2 * math.sqrt(8 / 3))
    assert peak_lr(recipe, 128, cuda=False) == 0.2  # CPU presets keep their own rates
    assert peak_lr(OptimizerConfig(lr=0.2, lr_rule=LRRule.sqrt), 96, cuda=False) == pytest.approx(0.1)
    assert peak_lr(OptimizerConfig(lr=0.3, lr_rule=LRRule.as_given), 2048, cuda=True) == 0.3


def test_global_norm_and_clip_scale():
    grads = [torch.full((3,), 3.0), torch.full((4,), 4.0)]
    norm = global_norm(grads)
    assert float(norm) == pytest.approx(math.sqrt(27 + 64))
    assert float(clip_scale(norm, 5.0)) == pytest.approx(math.sqrt(27 + 64) / 5.0)
    assert float(clip_scale(global_norm([torch.ones(2)]), 10.0)) == 1.0  # under the threshold: untouched
    assert float(clip_scale(norm, 0.0)) == 1.0  # clip_norm 0: no clipping


def _fused_and_reference(cfg, start):
    fused_p = torch.nn.Parameter(start.clone())
    ref_p = torch.nn.Parameter(start.clone())
    fused = build_optimizer(cfg, [fused_p], CPU)
    reference = torch.optim.Adagrad(
        [ref_p], lr=float(cfg.lr), initial_accumulator_value=float(cfg.initial_accumulator), eps=1e-10
    )
    return fused_p, fused, ref_p, reference


def test_fused_adagrad_with_clip_scale_equals_torch_adagrad_on_clipped_gradients():
    cfg = OptimizerConfig()
    torch.manual_seed(0)
    fused_p, fused, ref_p, reference = _fused_and_reference(cfg, torch.randn(10, 3))
    for _ in range(3):
        grad = torch.randn(10, 3) * 5
        norm = global_norm([grad])
        scale = clip_scale(norm, 2.0)
        fused_p.grad = grad.clone()
        apply_update(fused, scale, torch.zeros(()))
        ref_p.grad = grad * (2.0 / float(norm))
        reference.step()
    torch.testing.assert_close(fused_p.data, ref_p.data, rtol=1e-6, atol=1e-7)
    # TF Adagrad: acc starts at 1.0, w -= lr * g / sqrt(acc)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer(cfg, [p], CPU)
    p.grad = torch.tensor([2.0])
    apply_update(opt, torch.ones(()), torch.zeros(()))
    assert float(p.detach()) == pytest.approx(-0.2 * 2 / math.sqrt(1 + 4))


def test_found_inf_changes_nothing():
    for name in OptimizerName:
        cfg = OptimizerConfig(name=name)
        p = torch.nn.Parameter(torch.ones(4))
        opt = build_optimizer(cfg, [p], CPU)
        p.grad = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
        state_before = {k: v.clone() for k, v in opt.state[p].items()} if opt.state[p] else {}
        apply_update(opt, torch.tensor(float("nan")), torch.ones(()))
        assert p.tolist() == [1.0] * 4, name
        for key, value in state_before.items():
            assert torch.equal(opt.state[p][key], value), (name, key)


def test_adagrad_rows_equals_torch_sparse_adagrad():
    cfg = OptimizerConfig()
    torch.manual_seed(0)
    start = torch.randn(10, 3)
    rows_p = torch.nn.Parameter(start.clone())
    rows_opt = build_optimizer(cfg, [rows_p], CPU)
    sparse_p = torch.nn.Parameter(start.clone())
    sparse_opt = torch.optim.Adagrad([sparse_p], lr=0.2, initial_accumulator_value=1.0, eps=1e-10)
    for step in range(3):
        ids = torch.tensor([1, 4, 7]) + step
        values = torch.randn(3, 3)
        # two extra slots: empty (id 0, zero gradient), as the merged rows of a step have them
        padded_ids = torch.cat([ids, torch.zeros(2, dtype=torch.long)])
        padded = torch.cat([values, torch.zeros(2, 3)])
        adagrad_rows_(rows_opt, rows_p, padded_ids, padded, torch.tensor(2.0), torch.zeros(()))
        sparse_p.grad = torch.sparse_coo_tensor(
            ids.unsqueeze(0), values / 2.0, (10, 3), check_invariants=True
        )
        with torch.sparse.check_sparse_tensor_invariants(enable=True):
            sparse_opt.step()
    # the same arithmetic, except that torch's sparse add may fuse lr * update into the add (1 ulp)
    torch.testing.assert_close(rows_p.data, sparse_p.data, rtol=2e-7, atol=0)
    torch.testing.assert_close(
        rows_opt.state[rows_p]["sum"], sparse_opt.state[sparse_p]["sum"], rtol=0, atol=0
    )
    assert float(rows_opt.state[rows_p]["step"]) == 3.0
    before = rows_p.data.clone()
    adagrad_rows_(rows_opt, rows_p, ids, torch.full((3, 3), float("nan")), torch.ones(()), torch.ones(()))
    assert torch.equal(rows_p.data, before) and float(rows_opt.state[rows_p]["step"]) == 3.0


def test_lr_lives_in_one_device_tensor_and_survives_a_checkpoint_of_the_unfused_optimizer():
    cfg = OptimizerConfig()
    p = torch.nn.Parameter(torch.zeros(2))
    old = torch.optim.Adagrad([p], lr=0.2, initial_accumulator_value=1.0, eps=1e-10, foreach=False)
    p.grad = torch.ones(2)
    old.step()
    opt = build_optimizer(cfg, [p], CPU)
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and float(lr) == pytest.approx(0.2)
    opt.load_state_dict(old.state_dict())
    assert opt.param_groups[0]["lr"] is lr and opt.param_groups[0]["fused"] is True
    opt.set_lr(0.05)
    assert float(lr) == pytest.approx(0.05)
    assert opt.state_dict()["param_groups"][0]["lr"] == pytest.approx(0.05)  # a number, not the tensor
    p.grad = torch.ones(2)
    apply_update(opt, torch.ones(()), torch.zeros(()))
    # accumulator 1 + 1 + 1 = 3 after the second step
    assert float(p.detach()[0]) == pytest.approx(-0.2 / math.sqrt(2) - 0.05 / math.sqrt(3), rel=1e-6)


@pytest.mark.subprocess
def test_adagrad_cuda_kernel_under_the_triton_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (the Adagrad kernel is CUDA-only)")
    checks = Path(__file__).with_name("adagrad_kernel_checks.py")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(checks)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "adagrad kernel checks passed" in done.stdout

import math

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.train.config import OptimizerConfig
from pipeline.train.optimization import build_optimizer, clip_global_norm, lr_factor


def test_lr_schedules():
    assert lr_factor(5, 100, "constant", 0, 0.0) == 1.0
    assert lr_factor(0, 100, "constant", 10, 0.0) == pytest.approx(0.1)
    assert lr_factor(9, 100, "linear", 10, 0.0) == pytest.approx(1.0)
    assert lr_factor(100, 100, "linear", 0, 0.1) == pytest.approx(0.1)
    assert lr_factor(50, 100, "cosine", 0, 0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="optimizer.schedule"):
        lr_factor(0, 1, "step", 0, 0.0)


def test_clip_global_norm_scales_to_the_threshold():
    grads = [torch.full((3,), 3.0), torch.full((4,), 4.0)]
    norm = clip_global_norm(grads, 5.0)
    assert norm == pytest.approx(math.sqrt(27 + 64))
    assert clip_global_norm(grads, 5.0) == pytest.approx(5.0)
    assert grads[0][0] / grads[1][0] == pytest.approx(3 / 4)
    small = [torch.ones(2)]
    assert clip_global_norm(small, 10.0) == pytest.approx(math.sqrt(2))
    assert small[0].tolist() == [1.0, 1.0]


def test_sparse_adagrad_equals_dense_adagrad_with_tf_settings():
    cfg = OmegaConf.structured(OptimizerConfig)
    torch.manual_seed(0)
    start = torch.randn(10, 3)
    dense_p = torch.nn.Parameter(start.clone())
    sparse_p = torch.nn.Parameter(start.clone())
    dense_opt, sparse_opt = build_optimizer(cfg, [dense_p]), build_optimizer(cfg, [sparse_p])
    for step in range(3):
        rows = torch.tensor([1, 4, 7]) + step
        values = torch.randn(3, 3)
        dense = torch.zeros(10, 3).index_copy_(0, rows, values)
        dense_p.grad = dense
        sparse_p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, (10, 3))
        dense_opt.step()
        sparse_opt.step()
    torch.testing.assert_close(dense_p.data, sparse_p.data)
    # TF Adagrad: acc starts at 1.0, w -= lr * g / sqrt(acc)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer(cfg, [p])
    p.grad = torch.tensor([2.0])
    opt.step()
    assert float(p) == pytest.approx(-0.2 * 2 / math.sqrt(1 + 4))


def test_unknown_optimizer():
    cfg = OmegaConf.structured(OptimizerConfig)
    cfg.name = "sgd"
    with pytest.raises(ValueError, match="optimizer.name"):
        build_optimizer(cfg, [torch.nn.Parameter(torch.zeros(1))])

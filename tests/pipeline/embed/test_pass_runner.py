"""pipeline.embed.pass_runner (and loaded_model, settings) + hdf5_shard without Ray: values equal a direct BiLM call per sentence."""

from __future__ import annotations

import numpy as np
import pytest
from embed_fixtures import direct, expected_value, load_model, sample_lines
from tests_reference import fixture_expected, fixture_sentences_batch_major

from pipeline.config import ConfigError, load_config
from pipeline.embed.config import EmbedConfig
from pipeline.embed.errors import EmbedError
from pipeline.embed.pass_runner import PassRunner, embed_lines
from pipeline.embed.sentences import prepare_lines
from pipeline.embed.settings import EmbedSettings

torch_device = __import__("torch").device("cpu")


def _settings(
    *, batch_tokens: int = 120, max_batch_sentences: int = 16, device: str = "cpu", **choices
) -> EmbedSettings:
    """Pass settings for ``device``, for a config of ``choices`` (as ``key=value`` overrides) over
    a stateless, 20-token, split, replace base."""
    base = {"stateful_batch_size": 3, "max_sentence_tokens": 20, "lines_per_shard": 3}
    overrides = [f"{k}={v}" for k, v in {**base, **choices}.items()]
    config = load_config(EmbedConfig, overrides=["model=m", "input=[x]", "output=o", *overrides])
    return EmbedSettings(config, batch_tokens, max_batch_sentences, threads=1, device=device)


def _embed(model, lines, settings):
    prepared = prepare_lines(
        lines,
        0,
        max_tokens=settings.config.max_sentence_tokens,
        long_sentences=settings.config.long_sentences.value,
        invalid_utf8=settings.config.invalid_utf8.value,
        where="test",
    )
    model.stateful = settings.config.stateful
    shard = embed_lines(PassRunner(model, settings, torch_device), prepared)
    return [shard.value(i) for i in range(shard.num_lines)]


@pytest.fixture(scope="module")
def model():
    return load_model()


LINES = sample_lines(24) + [b"", b"a " * 45, b"bad \xff byte"]


@pytest.fixture(scope="module")
def expected_all(model):
    return [expected_value(model, line, "all", max_tokens=20) for line in LINES]


@pytest.mark.parametrize("mode", ["all", "top", "average"])
def test_values_equal_direct_call_whatever_the_batch(model, expected_all, mode):
    values = _embed(model, LINES, _settings(layers=mode))
    assert len(values) == len(LINES)
    for value, full in zip(values, expected_all, strict=True):
        expected = {"all": full, "top": full[-1], "average": full.mean(axis=0)}[mode]
        assert value.shape == expected.shape and value.dtype == np.float32
        # batching changes float32 summation order: allclose(atol=1e-6) with numpy's default rtol (docs/model.md#reference-outputs)
        np.testing.assert_allclose(value, expected, atol=1e-6, rtol=1e-5)


def test_empty_line_shapes(model):
    values = _embed(model, [b"", b"  \t"], _settings())
    assert [v.shape for v in values] == [(3, 0, 32), (3, 0, 32)]
    assert _embed(model, [b""], _settings(layers="top"))[0].shape == (0, 32)


def test_split_line_is_concatenation_of_independent_pieces(model):
    tokens = [f"w{i}" for i in range(45)]
    value = _embed(model, [" ".join(tokens).encode()], _settings())[0]
    assert value.shape == (3, 45, 32)
    np.testing.assert_allclose(value[:, 20:40], direct(model, tokens[20:40]), atol=1e-6, rtol=1e-5)


def test_stateful_reproduces_the_allennlp_fixture():
    # the fixture: a fresh stateful model, 10 batches of 3 rows in order (docs/model.md#reference-outputs)
    model = load_model()
    model.stateful = True
    lines = [" ".join(s).encode() for s in fixture_sentences_batch_major()]
    values = _embed(
        model, lines, _settings(stateful=True, layers="top", stateful_batch_size=3, max_sentence_tokens=1000)
    )
    expected = fixture_expected()
    worst = max(float(np.abs(v - expected[i % 3][i // 3]).max()) for i, v in enumerate(values))
    assert worst < 1e-5


def test_stateful_refuses_to_split(model):
    with pytest.raises(EmbedError, match="stateful mode cannot split"):
        _embed(model, [b"a " * 30], _settings(stateful=True))


@pytest.mark.parametrize("mode", ["all", "top"])
def test_mean_pool_is_the_mean_of_the_token_vectors_split_lines_included(model, expected_all, mode):
    values = _embed(model, LINES, _settings(layers=mode, pool="mean"))
    for line, value, full in zip(LINES, values, expected_all, strict=True):
        tokens = full if mode == "all" else full[-1]
        if tokens.shape[-2] == 0:  # an empty line: zeros
            assert value.shape == tokens.shape[:-2] + (32,) and not value.any()
            continue
        # the 45-token line is split into pieces of 20, 20 and 5: their means weighted by size
        np.testing.assert_allclose(value, tokens.mean(axis=-2), atol=1e-6, rtol=1e-5), line


def test_the_workers_settings_are_the_configs_own_choices_frozen():
    from dataclasses import FrozenInstanceError

    from pipeline.config import load_config
    from pipeline.embed.config import EmbedConfig, LayerMode, Pool, StoredDType
    from pipeline.embed.runner import settings_for

    cfg = load_config(
        EmbedConfig,
        overrides=["model=m", "input=[x]", "output=o", "layers=top", "dtype=float16", "pool=mean"],
    )
    settings = settings_for(cfg, "cpu")
    assert settings.config is cfg  # the config's own choices, not a copy of them
    assert (settings.config.layers, settings.config.dtype, settings.config.pool) == (
        LayerMode.top, StoredDType.float16, Pool.mean,
    )  # fmt: skip
    assert settings.pooled and _settings(layers="average").config.layers is LayerMode.average
    with pytest.raises(FrozenInstanceError):
        settings.config = cfg
    with pytest.raises(ConfigError, match="config key 'layers' must be one of all, top, average, got 'topp'"):
        _settings(layers="topp")


@pytest.mark.cuda
@pytest.mark.parametrize(("mode", "pool"), [("all", "none"), ("top", "none"), ("top", "mean")])
def test_cuda_passes_compacted_on_the_device_land_as_the_cpu_ones(model, mode, pool):
    """float32 on the GPU (CUDA graphs, compaction on the device, the pinned buffers reused pass
    after pass) stores what the CPU stores: every row in its place, within float32's rounding of
    two summation orders (cuBLAS against MKL: 1.9e-6 at values up to 1.4 on an H200, 2026-11-27;
    a row out of place or a buffer reused too early is off by the values themselves, ~1). The
    fixtures' own 1e-6 holds on the GPU too: benchmarks/gpu_check.py."""
    import torch

    settings = _settings(layers=mode, pool=pool, batch_tokens=64, max_batch_sentences=8, device="cuda")
    prepared = prepare_lines(
        LINES, 0, max_tokens=20, long_sentences="split", invalid_utf8="replace", where="t"
    )
    cpu = embed_lines(PassRunner(model, settings, torch_device), prepared)
    gpu_model = load_model().cuda()
    encoder = PassRunner(gpu_model, settings, torch.device("cuda"))
    for _ in range(2):  # the second time every shape replays its graph
        gpu = embed_lines(encoder, prepared)
        assert len(encoder.static.captured_shapes) > 1 and encoder._passes > len(encoder._pinned)
        np.testing.assert_array_equal(gpu.offsets, cpu.offsets)
        assert gpu.vectors.shape == cpu.vectors.shape and gpu.vectors.dtype == cpu.vectors.dtype
        assert np.abs(gpu.vectors - cpu.vectors).max() <= 1e-5

"""bilm-tf HDF5 weights: load into a BiLM and export back (docs/weights.md).

Every mapping is a transpose or a gate-block permutation, never arithmetic, so export -> load is
bit exact. Files are paths or binary file objects (h5py accepts both).
"""

from __future__ import annotations

import re

import h5py
import numpy as np
import torch

from elmo_model.characters import N_RAW_CHARACTERS
from elmo_model.hdf5_storage import require_stored_here
from elmo_model.lstm import INTERNAL_TO_TF, TF_TO_INTERNAL, permute_gate_blocks
from elmo_model.options import BiLMOptions

# Datasets that belong to the biLM; anything else in a file (e.g. an exported softmax) is ignored.
_MODEL_DATASET = re.compile(r"^(char_embed|CNN(_high_\d+|_proj)?/.*|RNN_\d+/.*)$")


class WeightsError(ValueError):
    """A malformed weight file; the message names the file and the dataset."""


def cell_prefix(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def expected_datasets(options: BiLMOptions) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every dataset of a bilm-tf weight file for these options (docs/weights.md#hdf5-layout)."""
    d_c, width, p, c = options.char_embed_dim, options.n_filters, options.projection_dim, options.dim
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (N_RAW_CHARACTERS, d_c)}
    for i, (w, n) in enumerate(options.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, w, d_c, n)
        shapes[f"CNN/b_cnn_{i}"] = (n,)
    for k in range(options.n_highway):
        for kind in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{kind}"] = (width, width)
            shapes[f"CNN_high_{k}/b_{kind}"] = (width,)
    if width != p:
        shapes["CNN_proj/W_proj"] = (width, p)
        shapes["CNN_proj/b_proj"] = (p,)
    for direction in range(2):
        for layer in range(options.n_layers):
            prefix = cell_prefix(direction, layer)
            shapes[f"{prefix}/W_0"] = (2 * p, 4 * c)
            shapes[f"{prefix}/B"] = (4 * c,)
            shapes[f"{prefix}/W_P_0"] = (c, p)
    return shapes


def _file_name(source) -> str:
    return str(getattr(source, "name", source))


def read_arrays(source, options: BiLMOptions) -> dict[str, np.ndarray]:
    """Read and validate every dataset `expected_datasets(options)` names -> float32 arrays.

    Raises WeightsError for a missing dataset, a wrong shape, a non-float or non-finite dataset, a
    biLM dataset the options do not account for (e.g. `CNN_high_2` with n_highway 2), or a dataset
    whose values live in another file (`require_stored_here`).
    """
    name = _file_name(source)
    expected = expected_datasets(options)
    try:
        handle = h5py.File(source, "r")
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{name}: cannot open as HDF5: {exc}") from exc
    with handle:
        present: list[str] = []
        handle.visititems(lambda key, obj: present.append(key) if isinstance(obj, h5py.Dataset) else None)
        for key in present:
            if key not in expected and _MODEL_DATASET.match(key):
                raise WeightsError(
                    f"{name}: dataset '{key}' is not part of the model described by the options "
                    f"(n_layers={options.n_layers}, n_highway={options.n_highway}, "
                    f"{len(options.filters)} filters); options and weights disagree"
                )
        arrays = {}
        for key, shape in expected.items():
            require_stored_here(handle, key, name, WeightsError)
            obj = handle.get(key)
            if not isinstance(obj, h5py.Dataset):
                raise WeightsError(f"{name}: missing dataset '{key}' (expected shape {shape})")
            if obj.shape != shape:
                raise WeightsError(
                    f"{name}: dataset '{key}' has shape {obj.shape}, expected {shape} from the options"
                )
            if obj.dtype.kind != "f":
                raise WeightsError(f"{name}: dataset '{key}' has dtype {obj.dtype}, expected float")
            value = np.asarray(obj[()], dtype=np.float32)
            if not np.isfinite(value).all():
                raise WeightsError(f"{name}: dataset '{key}' contains NaN or infinite values")
            arrays[key] = value
    return arrays


def _t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def load_weights(model, source) -> None:
    """Copy a bilm-tf weight file into `model` (a BiLM) in place (mapping of docs/weights.md#loading)."""
    copy_arrays(model, read_arrays(source, model.bilm_options))


def copy_arrays(model, a: dict[str, np.ndarray]) -> None:
    """Copy ``read_arrays``' result into `model` (a BiLM of the same options) in place."""
    enc, p = model.token_encoder, model.bilm_options.projection_dim
    with torch.no_grad():
        enc.char_embedding.weight[0].zero_()
        enc.char_embedding.weight[1:].copy_(_t(a["char_embed"]))
        for i, conv in enumerate(enc.convs):
            conv.weight.copy_(_t(a[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0)))
            conv.bias.copy_(_t(a[f"CNN/b_cnn_{i}"]))
        for k, highway in enumerate(enc.highways):
            w = np.concatenate([a[f"CNN_high_{k}/W_transform"].T, a[f"CNN_high_{k}/W_carry"].T])
            b = np.concatenate([a[f"CNN_high_{k}/b_transform"], a[f"CNN_high_{k}/b_carry"]])
            highway.linear.weight.copy_(_t(w))
            highway.linear.bias.copy_(_t(b))
        if enc.projection is not None:
            enc.projection.weight.copy_(_t(a["CNN_proj/W_proj"].T))
            enc.projection.bias.copy_(_t(a["CNN_proj/b_proj"]))
        for li, layer in enumerate(model.lstm.layers):
            for d in range(2):
                prefix = cell_prefix(d, li)
                kernel = _t(a[f"{prefix}/W_0"])
                # W_0 rows: the first `in` multiply x_t, the last P multiply h_{t-1} (docs/weights.md#loading).
                layer.w_ih[d].copy_(permute_gate_blocks(kernel[:-p], TF_TO_INTERNAL))
                layer.w_hh[d].copy_(permute_gate_blocks(kernel[-p:], TF_TO_INTERNAL))
                layer.bias[d].copy_(permute_gate_blocks(_t(a[f"{prefix}/B"]), TF_TO_INTERNAL))
                layer.w_p[d].copy_(_t(a[f"{prefix}/W_P_0"]))


def export_arrays(model) -> dict[str, np.ndarray]:
    """The inverse mapping (docs/weights.md#export): name -> float32 array, exactly `expected_datasets` names and shapes."""

    def np32(x: torch.Tensor) -> np.ndarray:
        return x.detach().to("cpu", torch.float32).numpy()

    enc, arrays = model.token_encoder, {}
    arrays["char_embed"] = np32(enc.char_embedding.weight[1:])  # 261 rows: readers prepend the zero row
    for i, conv in enumerate(enc.convs):
        arrays[f"CNN/W_cnn_{i}"] = np32(conv.weight).transpose(2, 1, 0)[None]
        arrays[f"CNN/b_cnn_{i}"] = np32(conv.bias)
    for k, highway in enumerate(enc.highways):
        w_transform, w_carry = np32(highway.linear.weight).reshape(2, highway.width, highway.width)
        b_transform, b_carry = np32(highway.linear.bias).reshape(2, highway.width)
        arrays.update(
            {
                f"CNN_high_{k}/W_carry": w_carry.T,
                f"CNN_high_{k}/b_carry": b_carry,
                f"CNN_high_{k}/W_transform": w_transform.T,
                f"CNN_high_{k}/b_transform": b_transform,
            }
        )
    if enc.projection is not None:
        arrays["CNN_proj/W_proj"] = np32(enc.projection.weight).T
        arrays["CNN_proj/b_proj"] = np32(enc.projection.bias)
    for li, layer in enumerate(model.lstm.layers):
        for d in range(2):
            prefix = cell_prefix(d, li)
            kernel = torch.cat([layer.w_ih[d], layer.w_hh[d]])
            arrays[f"{prefix}/W_0"] = np32(permute_gate_blocks(kernel, INTERNAL_TO_TF))
            arrays[f"{prefix}/B"] = np32(permute_gate_blocks(layer.bias[d], INTERNAL_TO_TF))
            arrays[f"{prefix}/W_P_0"] = np32(layer.w_p[d])
    return {key: np.ascontiguousarray(value) for key, value in arrays.items()}


def save_weights(model, target) -> None:
    """Write `model`'s weights as a bilm-tf HDF5 file (float32, nested groups, no attributes)."""
    arrays = export_arrays(model)
    with h5py.File(target, "w") as handle:
        for key, value in arrays.items():
            handle.create_dataset(key, data=value)

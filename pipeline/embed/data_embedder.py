"""``ElmoEmbedder``: ELMo vectors as one step of a user's own Ray Data pipeline.

    import ray
    from pipeline.embed import ElmoEmbedder

    ds = ray.data.read_parquet("texts/")                      # a column "text", one sentence a row
    ds = ds.map_batches(
        ElmoEmbedder,
        fn_constructor_kwargs={"model_dir": "runs/demo/train/export", "layers": "top", "pool": "mean"},
        batch_size=256,
        concurrency=2,        # actors; each loads the model once
        num_gpus=0,           # 1: an actor per GPU
    )
    ds.write_parquet("vectors/")                               # Ray Data's own writer

Each row's text is tokenized as ``elmo embed`` tokenizes a line (invalid UTF-8 replaced, control
characters as spaces, whitespace-split; sentences longer than ``max_sentence_tokens`` embedded in
pieces) and run through the same model code as the stage's actors (``loaded_model.LoadedModel``:
static-shape passes, CUDA graphs on a GPU), so a sentence gets the stage's vectors. The batch comes
back as an Arrow table with the vectors added as ``output_column``, typed as in the stage's Parquet
shards (``parquet_shard``): per token a list of vectors, pooled one vector a row, float16 or float32
as ``dtype`` says.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.embed.config import EmbedConfig, LayerMode, Pool, Precision, StoredDType
from pipeline.embed.errors import EmbedError
from pipeline.embed.inputs import ShardSpec
from pipeline.embed.loaded_model import LoadedModel
from pipeline.embed.parquet_shard import vectors_column
from pipeline.embed.pass_size import pass_size, per_position
from pipeline.embed.sentences import PreparedLines, prepare_lines, prepare_token_lists
from pipeline.embed.settings import EmbedSettings, work_settings
from pipeline.embed.shard_work import work_from_lines
from pipeline.model_loader import Device, pick_device, resolve_model


class ElmoEmbedder:
    """A callable class for ``Dataset.map_batches`` (or any batch of texts).

    ``model_dir``: a folder with ``options.json`` + ``weights.hdf5`` (what ``elmo train`` exports),
    local or ``s3://``; or ``options_file`` + ``weights_file``. ``layers`` (``top``, ``all``,
    ``average``), ``pool`` (``none``, ``mean``), ``dtype`` (``float32``, ``float16``) and
    ``precision`` (``float32``, ``tf32``, ``bf16``) mean what they mean for ``elmo embed``.
    ``text_column``: the column of sentences (strings); or ``tokens_column``: a column of token
    lists. ``output_column``: where the vectors go. ``device``: ``auto`` (a GPU when the actor has
    one), ``cuda`` or ``cpu``; ``batch_tokens`` / ``max_batch_sentences``: the pass size (0: chosen
    for the device, as the stage chooses it). ``threads``: torch threads on a CPU.

    A batch is a pandas DataFrame, a pyarrow Table or a dict of numpy arrays (Ray Data's batch
    formats); the result is a pyarrow Table holding the batch's columns and ``output_column``.
    """

    def __init__(
        self,
        model_dir: str = "",
        *,
        options_file: str = "",
        weights_file: str = "",
        layers: str = "top",
        pool: str = "none",
        dtype: str = "float32",
        precision: str = "float32",
        text_column: str = "text",
        tokens_column: str = "",
        output_column: str = "vectors",
        device: str = "auto",
        batch_tokens: int = 0,
        max_batch_sentences: int = 0,
        max_sentence_tokens: int = 1000,
        threads: int = 1,
    ):
        _check_choices(layers=layers, pool=pool, dtype=dtype, precision=precision, device=device)
        source = resolve_model(model_dir, options_file, weights_file, EmbedError)
        kind = pick_device(device).type
        output = _output_spec(layers, pool, dtype)
        free = _free_memory() if kind == "cuda" and not batch_tokens else 0
        size = pass_size(
            batch_tokens, max_batch_sentences, kind, free, per_position(source, precision, output)
        )
        choices = EmbedConfig(
            layers=LayerMode(layers),
            dtype=StoredDType(dtype),
            precision=Precision(precision),
            pool=Pool(pool),
            max_sentence_tokens=max_sentence_tokens,
        )  # the stage's defaults for the rest: stateless, long sentences split, invalid UTF-8 replaced
        self.settings = EmbedSettings(choices, size.tokens, size.rows, threads=threads, device=kind)
        self.text_column, self.tokens_column, self.output_column = text_column, tokens_column, output_column
        self.model = LoadedModel(source, self.settings)
        self.work = work_settings(self.settings)

    def __call__(self, batch: Any) -> pa.Table:
        try:
            table = as_table(batch)
        except EmbedError:
            # Arrow blames the first cell that does not fit the ones before it; in the text column
            # the first cell that is not text is the one to name ({'text': [5, 'a b']}: row 0)
            columns = batch if isinstance(batch, dict) else getattr(batch, "columns", ())  # a DataFrame's
            if not self.tokens_column and self.text_column in columns:
                for row, text in enumerate(batch[self.text_column]):
                    _raw_line(text, row, self.text_column)
            raise
        if self.output_column in table.column_names:
            raise EmbedError(
                f"ElmoEmbedder: the batch already has a column {self.output_column!r}; set output_column= "
                "to a new name"
            )
        prepared = self._prepared(table)
        spec = ShardSpec(0, 0, prepared.num_lines, segments=(), input_sha256="")
        shard = self.model.embed(work_from_lines(spec, True, prepared, self.work))
        try:  # the column must not view the model's pooled buffer, which the next batch reuses
            own = dataclasses.replace(shard, vectors=np.array(shard.vectors))
        finally:
            self.model.buffers.release(shard)
        return table.append_column(self.output_column, vectors_column(own))

    def _prepared(self, table: pa.Table) -> PreparedLines:
        """The batch's sentences: a text column tokenized as the stage tokenizes a line of a file
        (bytes taken as the raw line, invalid UTF-8 and lone surrogates replaced), or a tokens
        column taken as given."""
        max_tokens = self.settings.config.max_sentence_tokens
        if self.tokens_column:
            if self.tokens_column not in table.column_names:
                raise EmbedError(f"ElmoEmbedder: the batch has no column {self.tokens_column!r}")
            rows = table.column(self.tokens_column).to_pylist()
            return prepare_token_lists(
                rows, max_tokens=max_tokens, where=f"ElmoEmbedder: column {self.tokens_column!r}"
            )
        if self.text_column not in table.column_names:
            raise EmbedError(
                f"ElmoEmbedder: the batch has no column {self.text_column!r} (its columns: "
                f"{', '.join(table.column_names)}); set text_column= or tokens_column="
            )
        lines = [
            _raw_line(text, row, self.text_column)
            for row, text in enumerate(table.column(self.text_column).to_pylist())
        ]
        return prepare_lines(
            lines, 0, max_tokens=max_tokens, long_sentences="split", invalid_utf8="replace", where="batch"
        )


def _raw_line(text: Any, row: int, column: str) -> bytes:
    """A text cell as the bytes of a line of a file: str as UTF-8 (a lone surrogate becomes bytes
    that are not UTF-8, replaced as a file's would be), bytes as they are, None as empty."""
    if text is None:
        return b""
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        return text.encode("utf-8", errors="surrogatepass")
    raise EmbedError(f"ElmoEmbedder: row {row} of column {column!r} is {type(text).__name__}, not text")


def _check_choices(**chosen: str) -> None:
    """One line naming a setting whose value is not one of its choices."""
    kinds = {
        "layers": LayerMode,
        "pool": Pool,
        "dtype": StoredDType,
        "precision": Precision,
        "device": Device,
    }
    for key, value in chosen.items():
        names = [m.value for m in kinds[key]]
        if value not in names:
            raise EmbedError(f"ElmoEmbedder: {key}={value!r} is not one of {', '.join(names)}")


def _output_spec(layers: str, pool: str, dtype: str):
    """The pass output for ``layers``/``pool``/``dtype`` (checked by the config's own choices)."""
    import torch

    from elmo_model.static_inference import OutputSpec

    layers, pool, dtype = LayerMode(layers), Pool(pool), StoredDType(dtype)
    torch_dtype = torch.float16 if dtype is StoredDType.float16 else torch.float32
    return OutputSpec(layers.value, pool=pool is Pool.mean, dtype=torch_dtype)


def _free_memory() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])


def as_table(batch: Any, who: str = "ElmoEmbedder") -> pa.Table:
    """The batch as an Arrow table; a cell Arrow cannot hold is one line naming ``who``, its row
    and its column."""
    if isinstance(batch, pa.Table):
        return batch
    try:
        import pandas as pd
    except ImportError:  # pandas comes with Ray Data; without it, a batch is never a DataFrame
        pd = None
    is_frame = pd is not None and isinstance(batch, pd.DataFrame)
    if not (isinstance(batch, dict) or is_frame):
        raise EmbedError(
            f"{who}: a batch is a pandas DataFrame, a pyarrow Table or a dict, not {type(batch).__name__}"
        )
    try:
        if is_frame:
            return pa.Table.from_pandas(batch, preserve_index=False).replace_schema_metadata(None)
        return pa.table({name: _column(values) for name, values in batch.items()})
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError):
        columns = {name: list(batch[name]) for name in (batch.columns if is_frame else batch)}
        for name, values in columns.items():
            if (problem := _first_bad_cell(values)) is not None:
                raise EmbedError(f"{who}: row {problem[0]} of column {name!r} {problem[1]}") from None
        raise


def _first_bad_cell(values: list) -> tuple[int, str] | None:
    """(row, what is wrong) of the first cell of a column that Arrow cannot hold: a string that is
    not text (a lone surrogate), or a value that does not fit the column the rows before it make
    (Arrow takes ints and floats together, or str and bytes, so the first cell of another Python
    type is not always the one it refuses). The row is found by halving: a column Arrow refuses
    has a shortest refused prefix, and its last cell is the culprit."""
    if _holds(values):
        return None
    lo, hi = 0, len(values)  # values[:lo] is held, values[:hi] is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _holds(values[:mid]) else (lo, mid)
    row, value = hi - 1, values[hi - 1]
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return row, f"holds {value[err.start]!r} (a lone surrogate), which is not text"
    if isinstance(value, list | np.ndarray):
        inner = _first_bad_cell([v.item() if isinstance(v, np.generic) else v for v in value])
        if inner is not None:
            return row, f"item {inner[0]} {inner[1]}"
    before = sorted({type(v).__name__ for v in values[:row] if v is not None})
    if before and type(value).__name__ not in before:
        return row, f"is {type(value).__name__}, not {' or '.join(before)} as the rows before it"
    if row == 0:
        return row, f"is {type(value).__name__}, which Arrow cannot hold"
    held = _column(_objects(values[:row])).type
    return row, f"is {type(value).__name__} and does not fit the {held} the rows before it hold"


def _holds(values: list) -> bool:
    """Whether Arrow makes one column of ``values``."""
    try:
        _column(_objects(values))
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError):
        return False
    return True


def _objects(values: list) -> np.ndarray:
    """``values`` as a 1-d object array, as Ray Data gives a column (lists stay cells)."""
    array = np.empty(len(values), dtype=object)
    for row, value in enumerate(values):  # an error's path only: assigning a slice would broadcast lists
        array[row] = value
    return array


def _column(values: Any) -> pa.Array:
    """A numpy column (Ray Data's ``numpy`` format: strings and token lists as object arrays)."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return pa.array([v.tolist() if isinstance(v, np.ndarray) else v for v in values])
    return pa.array(values)

"""ElmoEmbedder (pipeline/embed/data_embedder.py): ELMo vectors as a step of a user's own Ray Data
pipeline, the stage's vectors for the same sentences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from embed_fixtures import OPTIONS, WEIGHTS, direct, expected_value, load_model, sample_lines

from pipeline.embed import ElmoEmbedder, read_embeddings
from pipeline.embed.errors import EmbedError

FILES = {"options_file": str(OPTIONS), "weights_file": str(WEIGHTS)}
LINES = [*sample_lines(12, start=700), b"", b"God\x00created the heaven"]


def test_a_batch_gets_the_stages_vectors_whatever_its_format():
    model = load_model()
    texts = [line.decode("utf-8") for line in LINES]
    embed = ElmoEmbedder(**FILES, layers="all", threads=1)
    for batch in (
        pd.DataFrame({"text": texts, "id": range(len(texts))}),
        {"text": np.array(texts, dtype=object)},
        pa.table({"text": texts}),
    ):
        table = embed(batch)
        assert table.column_names[-1] == "vectors" and table.num_rows == len(texts)
        for line, row in zip(LINES, table.column("vectors").to_pylist(), strict=True):
            value = (
                np.array(row, dtype=np.float32).reshape(-1, 3, 32).swapaxes(0, 1)
            )  # tokens first -> AllenNLP
            np.testing.assert_allclose(value, expected_value(model, line, "all"), atol=1e-6, rtol=1e-5)
    pooled = ElmoEmbedder(**FILES, layers="top", pool="mean", dtype="float16", threads=1)(
        {"text": np.array(texts, dtype=object)}
    )
    assert pooled.schema.field("vectors").type == pa.list_(pa.float16(), 32)
    tokens = ElmoEmbedder(**FILES, tokens_column="tokens", threads=1)(
        pa.table({"tokens": [["In", "the", "beginning"]]})
    )
    np.testing.assert_allclose(
        np.array(tokens.column("vectors")[0].as_py()),
        expected_value(model, b"In the beginning", "top"),
        atol=1e-6,
    )
    with pytest.raises(
        EmbedError, match="the batch has no column 'text' .*set text_column= or tokens_column="
    ):
        embed(pa.table({"sentence": ["a b"]}))


def test_inside_map_batches_on_the_cluster_it_gives_what_the_stage_wrote(ray_local, tmp_path):
    import ray

    from pipeline.config import load_config
    from pipeline.embed.config import EmbedConfig
    from pipeline.embed.runner import run_embed

    corpus = tmp_path / "in.txt"
    corpus.write_bytes(b"\n".join(LINES) + b"\n")
    out = tmp_path / "out"
    items = {
        **FILES,
        "input": f"[{corpus}]",
        "output": str(out),
        "layers": "top",
        "progress": False,
        "workers": 1,
    }
    run_embed(load_config(EmbedConfig, overrides=[f"{k}={v}" for k, v in items.items()]))
    stage = dict(read_embeddings(str(out)))

    ds = ray.data.from_items([{"line": i, "text": line.decode("utf-8")} for i, line in enumerate(LINES)])
    ds = ds.map_batches(
        ElmoEmbedder, fn_constructor_kwargs={**FILES, "layers": "top"}, batch_size=5, concurrency=1
    )
    rows = sorted(ds.take_all(), key=lambda row: row["line"])
    assert [row["line"] for row in rows] == list(range(len(LINES)))
    for row in rows:
        value = np.array([np.asarray(v) for v in row["vectors"]], dtype=np.float32).reshape(-1, 32)
        np.testing.assert_allclose(value, stage[row["line"]], atol=1e-6, rtol=1e-5)


def test_a_users_tokens_are_embedded_as_given_never_split_again():
    """``["New York", "is", "big"]`` is three tokens: one vector for "New York" (its characters,
    the space among them), not four vectors of other tokens."""
    model = load_model()
    embed = ElmoEmbedder(**FILES, tokens_column="tokens", threads=1)
    table = embed(pa.table({"tokens": [["New York", "is", "big"], [], None]}))
    rows = table.column("vectors").to_pylist()
    assert [len(r) for r in rows] == [3, 0, 0]
    np.testing.assert_allclose(np.array(rows[0]), direct(model, ["New York", "is", "big"], "top"), atol=1e-6)
    with pytest.raises(EmbedError, match=r"row 0 has the token ''; tokens are non-empty strings"):
        embed(pa.table({"tokens": [["a", ""]]}))
    mixed = np.empty(1, dtype=object)
    mixed[0] = ["a", 3]
    with pytest.raises(
        EmbedError, match=r"row 0 of column 'tokens' item 1 is int, not str as the rows before it"
    ):
        embed({"tokens": mixed})


def test_what_is_not_text_or_not_a_choice_is_one_line():
    embed = ElmoEmbedder(**FILES, threads=1)
    model = load_model()
    # bytes are a raw line, as read from a file (its invalid UTF-8 replaced); None the empty line
    table = embed(pa.table({"text": pa.array([b"In the beginning", b"God\xff created", None], pa.binary())}))
    rows = table.column("vectors").to_pylist()
    np.testing.assert_allclose(
        np.array(rows[0]), expected_value(model, b"In the beginning", "top"), atol=1e-6
    )
    assert len(rows[1]) == 2 and rows[2] == []
    with pytest.raises(EmbedError, match=r"row 1 of column 'text' is int, not text"):
        embed({"text": np.array(["a", 7], dtype=object)})
    # issue 65, item 19: the first cell that is not text is named, not the text Arrow refuses after it
    with pytest.raises(EmbedError, match=r"row 0 of column 'text' is int, not text"):
        embed({"text": [5, "a b"]})
    # Arrow holds ints and floats in one column: the row it refuses is the text after them
    with pytest.raises(
        EmbedError, match=r"row 2 of column 'n' is str, not float or int as the rows before it"
    ):
        embed({"text": np.array(["a", "b", "c"], dtype=object), "n": np.array([1, 2.5, "x"], dtype=object)})
    with pytest.raises(
        EmbedError, match=r"row 1 of column 'n' is list and does not fit the list<item: int64>"
    ):
        embed({"text": ["a", "b"], "n": [[1], ["x"]]})
    with pytest.raises(
        EmbedError, match=r"row 1 of column 'text' holds '\\ud800' \(a lone surrogate\), which is not text"
    ):
        embed({"text": np.array(["a", "God\ud800 created"], dtype=object)})
    with pytest.raises(EmbedError, match=r"row 0 of column 'text' is float, not text"):
        embed(pa.table({"text": [1.5]}))
    with pytest.raises(EmbedError, match=r"the batch already has a column 'text'; set output_column="):
        ElmoEmbedder(**FILES, output_column="text", threads=1)(pa.table({"text": ["a b"]}))
    for key, value in (
        ("layers", "bogus"),
        ("pool", "max"),
        ("dtype", "int8"),
        ("precision", "fp8"),
        ("device", "tpu"),
    ):
        with pytest.raises(EmbedError) as err:
            ElmoEmbedder(**FILES, **{key: value})
        assert str(err.value).startswith(f"ElmoEmbedder: {key}={value!r} is not one of ") and "\n" not in str(
            err.value
        )

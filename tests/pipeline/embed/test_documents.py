"""Documents in a Ray Data pipeline (pipeline/embed/documents.py): records split into sentences that
keep their ids, embedded, and pooled back per record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from embed_fixtures import OPTIONS, WEIGHTS, expected_value, load_model

from pipeline.embed import ElmoEmbedder, SentenceSplitter, pool_records
from pipeline.embed.documents import record_means
from pipeline.embed.errors import EmbedError

FILES = {"options_file": str(OPTIONS), "weights_file": str(WEIGHTS)}
RECORDS = {
    "id": ["gen-1", "empty", "gen-2", "none"],
    "text": [
        "In the beginning God created the heaven and the earth. And the earth was without form.",
        "",
        "And God said, Let there be light.\n\nAnd there was light.",
        None,
    ],
    "year": [1611, 1611, 1769, 1769],
}


def test_records_become_sentences_that_keep_their_columns():
    table = SentenceSplitter()(pa.table(RECORDS))
    assert table.column_names == ["id", "text", "year", "sentence"]
    assert table.to_pydict() == {
        "id": ["gen-1", "gen-1", "gen-2", "gen-2"],
        "text": [
            "In the beginning God created the heaven and the earth.",
            "And the earth was without form.",
            "And God said, Let there be light.",
            "And there was light.",
        ],
        "year": [1611, 1611, 1769, 1769],
        "sentence": [0, 1, 0, 1],
    }
    whole = SentenceSplitter(split=False)({"id": ["a"], "text": ["One. Two.\nThree"]})
    assert whole.column("text").to_pylist() == ["One. Two. Three"] and whole.column(
        "sentence"
    ).to_pylist() == [0]
    with pytest.raises(
        EmbedError, match=r"SentenceSplitter: the batch has no column 'body' .*set text_column="
    ):
        SentenceSplitter(text_column="body")(pa.table(RECORDS))
    with pytest.raises(EmbedError, match=r"SentenceSplitter: row 1 of column 'text' is not text"):
        SentenceSplitter()({"text": [None, 3]})


def test_a_records_mean_is_the_mean_of_its_sentences_token_vectors():
    model = load_model()
    sentences = SentenceSplitter()(pa.table(RECORDS))
    for layers in ("top", "all"):
        embedded = ElmoEmbedder(**FILES, layers=layers, threads=1)(sentences)
        pooled = record_means(embedded, "id").to_pydict()
        assert pooled["id"] == ["gen-1", "gen-2"]
        for name, mean in zip(pooled["id"], pooled["vectors"], strict=True):
            lines = [
                t.encode()
                for t, i in zip(sentences["text"].to_pylist(), sentences["id"].to_pylist(), strict=True)
                if i == name
            ]
            tokens = np.concatenate([expected_value(model, line, layers) for line in lines], axis=-2)
            np.testing.assert_allclose(np.array(mean, dtype=np.float32), tokens.mean(axis=-2), atol=1e-6)
    with pytest.raises(
        EmbedError,
        match=r"column 'vectors' holds fixed_size_list<item: float>\[32\], not a list of token vectors",
    ):
        record_means(ElmoEmbedder(**FILES, pool="mean", threads=1)(sentences), "id")


def test_on_the_cluster_from_parquet_to_one_vector_per_record(ray_local, tmp_path):
    import pyarrow.parquet as pq
    import ray

    pq.write_table(pa.table(RECORDS), tmp_path / "docs.parquet", row_group_size=2)
    ds = ray.data.read_parquet(str(tmp_path / "docs.parquet"))
    ds = ds.map_batches(SentenceSplitter(), batch_format="pyarrow")  # tasks: the actor holds the other CPU
    ds = ds.map_batches(
        ElmoEmbedder, fn_constructor_kwargs={**FILES, "threads": 1}, batch_size=3, concurrency=1
    )
    rows = {(r["id"], r["sentence"]): r for r in ds.take_all()}
    assert sorted(rows) == [("gen-1", 0), ("gen-1", 1), ("gen-2", 0), ("gen-2", 1)]
    model = load_model()
    second = rows[("gen-2", 1)]
    np.testing.assert_allclose(
        np.array([np.asarray(v) for v in second["vectors"]], dtype=np.float32),
        expected_value(model, b"And there was light.", "top"),
        atol=1e-6,
    )
    means = {r["id"]: np.asarray(r["vectors"], dtype=np.float32) for r in pool_records(ds, "id").take_all()}
    assert sorted(means) == ["gen-1", "gen-2"]
    gen1 = np.concatenate([expected_value(model, rows[("gen-1", i)]["text"].encode(), "top") for i in (0, 1)])
    np.testing.assert_allclose(means["gen-1"], gen1.mean(axis=0), atol=1e-6)

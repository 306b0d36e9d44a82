"""Documents in a user's own Ray Data pipeline: records split into sentences that keep their
record's columns (its id), and the vectors of a record pooled from its sentences'.

    import ray
    from pipeline.embed import ElmoEmbedder, SentenceSplitter, pool_records

    ds = ray.data.read_parquet("s3://bucket/fineweb/")          # columns "id", "text": a document a row
    ds = ds.map_batches(SentenceSplitter(text_column="text"), batch_format="pyarrow")  # as tasks
    # now a sentence a row: "id" (and every other column of its record), "sentence" (its index in
    # the record, from 0) and "text" (the sentence)
    ds = ds.map_batches(ElmoEmbedder, fn_constructor_kwargs={"model_dir": "runs/x/export"},
                        batch_size=256, concurrency=2)
    ds.write_parquet("vectors/")                                 # found again by (id, sentence)
    records = pool_records(ray.data.read_parquet("vectors/"), "id")  # one mean vector per record
    # (pooled from what was written: pooling ``ds`` again would run the model again)

The split is :mod:`pipeline.formats.sentence_split`'s (Bling Fire, a blank line always ending a
sentence), which the shard stage uses too, so a sentence here is one the shard stage trained on.
Ray Data's readers split files by row group (``read_parquet``) or by file (``read_json``): the
driver holds no row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.embed.data_embedder import as_table
from pipeline.embed.errors import EmbedError
from pipeline.formats.sentence_split import document_sentences

SENTENCE_COLUMN = "sentence"


class SentenceSplitter:
    """A callable for ``Dataset.map_batches`` (an instance runs as Ray tasks; it holds no model, so
    it needs no actor of its own): a batch of records -> a row per
    sentence, in order. ``text_column``: the documents (strings; a null is a record of no
    sentence); the sentence replaces it there. Every other column is the record's, repeated;
    ``sentence_column`` (int32) is the sentence's index in its record. ``split=False`` keeps each
    record one sentence (its newlines as spaces)."""

    def __init__(self, text_column: str = "text", sentence_column: str = SENTENCE_COLUMN, split: bool = True):
        self.text_column, self.sentence_column, self.split = text_column, sentence_column, split

    def __call__(self, batch: Any) -> pa.Table:
        table = as_table(batch, "SentenceSplitter")
        if self.text_column not in table.column_names:
            raise EmbedError(
                f"SentenceSplitter: the batch has no column {self.text_column!r} (its columns: "
                f"{', '.join(table.column_names)}); set text_column="
            )
        if self.sentence_column in table.column_names:
            raise EmbedError(
                f"SentenceSplitter: the batch already has a column {self.sentence_column!r}; set sentence_column="
            )
        texts = table.column(self.text_column).to_pylist()
        if any(text is not None and not isinstance(text, str) for text in texts):
            row = next(i for i, text in enumerate(texts) if text is not None and not isinstance(text, str))
            raise EmbedError(f"SentenceSplitter: row {row} of column {self.text_column!r} is not text")
        kept = [text or "" for text in texts]
        sentences, counts = document_sentences(kept, self.split)
        rows = np.repeat(np.arange(len(texts)), counts)
        starts = np.cumsum(counts) - counts
        index = np.arange(len(sentences), dtype=np.int64) - np.repeat(starts, counts)
        where = table.column_names.index(self.text_column)
        out = table.take(pa.array(rows, pa.int64()))
        out = out.set_column(where, self.text_column, pa.array(sentences, pa.string()))
        return out.append_column(self.sentence_column, pa.array(index.astype(np.int32), pa.int32()))


def pool_records(ds, key: str, vectors_column: str = "vectors", output_column: str = "vectors"):
    """A Ray Dataset of one row per record: ``key`` and the mean of its sentences' token vectors
    (float32 ``(2P,)``, or ``(N+1, 2P)`` for ``layers=all``). ``ds``: rows of ``ElmoEmbedder``
    run with ``pool=none`` (per sentence, a list of token vectors): every token of the record
    weighs the same, whatever sentence it is in. A record of no token is left out."""

    def mean(group: pa.Table) -> pa.Table:
        return record_means(group, key, vectors_column, output_column)

    return ds.groupby(key).map_groups(mean, batch_format="pyarrow")


def record_means(
    table: pa.Table, key: str, vectors_column: str = "vectors", output_column: str = "vectors"
) -> pa.Table:
    """:func:`pool_records` on one table: a row per distinct ``key`` that has a token, in order of
    first sight; float32 means over the tokens of all its rows."""
    import pyarrow.compute as pc

    column = table.column(vectors_column).combine_chunks()
    if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
        raise EmbedError(
            f"pool_records: column {vectors_column!r} holds {column.type}, not a list of token vectors "
            "(ElmoEmbedder with pool=none)"
        )
    tokens = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)  # (S,)
    leaf = column.flatten()
    shape: list[int] = []  # outermost first
    while pa.types.is_fixed_size_list(leaf.type):  # 2P, then N+1 for layers=all
        shape.append(leaf.type.list_size)
        leaf = leaf.flatten()
    values = leaf.to_numpy(zero_copy_only=False).astype(np.float32).reshape(int(tokens.sum()), -1)
    codes = pc.dictionary_encode(table.column(key)).combine_chunks()
    sentence_record = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)  # (S,)
    token_record = np.repeat(sentence_record, tokens)  # (T,)
    records = len(codes.dictionary)
    sums = np.zeros((records, values.shape[1]), dtype=np.float64)
    np.add.at(sums, token_record, values)
    counts = np.bincount(token_record, minlength=records)
    present = np.flatnonzero(counts)
    means = (sums[present] / counts[present, None]).astype(np.float32)
    out: pa.Array = pa.array(means.reshape(-1), pa.float32())
    for size in reversed(shape):  # innermost first: 2P, then N+1, as ElmoEmbedder nests them
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return pa.table({key: codes.dictionary.take(pa.array(present)), output_column: out})

"""Stage 3: bulk embedding of a corpus with a biLM (``elmo embed`` / ``python -m jobs.embed``).

Modules, in the order a run uses them:

- ``config``: EmbedConfig (every key documented) and the up-front setting checks;
- ``pipeline.model_loader`` (shared with the probe): find, check, hash and load the model (folder or
  two files, local or s3://), and the device it runs on;
- ``inputs``: cut the input (text files, a shard directory, record files) into line ranges, read one
  back; ``record_inputs``: a record corpus's shards of whole records, planned by Ray tasks;
- ``resume``: claim the output, find complete shards, commit a shard atomically (exactly-once);
- ``dataflow``: the Ray Data graph: CPU tasks preparing shards (``shard_work``) feeding an actor
  pool of ``EmbedActor`` (``actor``: the stage's actor), each holding one ``LoadedModel``
  (``loaded_model``: the model loaded once, shared with ``ElmoEmbedder``) and its writer processes
  (``shard_writers``: each shard committed by a process of its own, from shared memory);
- ``settings``: what actors and preparing tasks are told; ``sentences`` / ``shard_work`` /
  ``pass_runner``: lines -> tokens -> static forward passes (``PassRunner``; or, stateful,
  input-order batches: ``batching``) -> values;
- ``shard_vectors``: a shard's vectors assembled from the passes; ``hdf5_shard``: AllenNLP's HDF5 layout
  and the packed one; ``parquet_shard``: the Parquet form; ``manifest``: output names and manifest.json;
- ``single_file``: one AllenNLP-style file with ``sentence_to_index``; ``runner``: all of it, in order;
- ``file_format``: the output formats (HDF5, Parquet) as objects a shard is written by;
  ``pass_size``: a pass's rows and tokens sized to the device; ``startup``: the run's start-up
  phases, timed and said; ``errors``: EmbedError; ``stage``: the stage's closing lines.

Public, for users: ``read_embeddings(output)`` (``reader``: any output, in line order; with
``records=True`` each sentence's record id and index too) and ``read_record_vectors(output)`` (an
output pooled per record),
``ElmoEmbedder`` (``data_embedder``: a step of one's own Ray Data pipeline), and for documents
``SentenceSplitter`` and ``pool_records`` (``documents``: records split into sentences that keep
their record's columns, and a record's mean vector). They are imported on
first use, so ``import pipeline.embed.config`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ElmoEmbedder", "SentenceSplitter", "pool_records", "read_embeddings", "read_record_vectors"]


def __getattr__(name: str) -> Any:
    if name in ("read_embeddings", "read_record_vectors"):
        from pipeline.embed import reader

        return getattr(reader, name)
    if name == "ElmoEmbedder":
        from pipeline.embed.data_embedder import ElmoEmbedder

        return ElmoEmbedder
    if name in ("SentenceSplitter", "pool_records"):
        from pipeline.embed import documents

        return getattr(documents, name)
    raise AttributeError(f"module 'pipeline.embed' has no attribute {name!r}")

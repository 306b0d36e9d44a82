"""Stage 3: bulk embedding of a corpus with a biLM (``elmo embed`` / ``python -m jobs.embed``).

Modules, in the order a run uses them:

- ``config``: EmbedConfig (every key documented) and the up-front setting checks;
- ``model_files``: find, check, hash and load the model (folder or two files, local or s3://);
- ``inputs``: cut the input (text files or a shard directory) into fixed line ranges, read one back;
- ``resume``: claim the output, find complete shards, commit a shard atomically (exactly-once);
- ``dataflow``: the Ray Data graph: CPU tasks preparing shards (``shard_work``) feeding an actor
  pool of ``ShardEmbedder`` (``embedder``);
- ``sentences`` / ``shard_work`` / ``embedder``: lines -> tokens -> static forward passes (or, stateful,
  input-order batches: ``batching``) -> values;
- ``hdf5_shard``: AllenNLP's HDF5 layout and the packed one; ``manifest``: output names and manifest.json;
- ``single_file``: one AllenNLP-style file with ``sentence_to_index``; ``runner``: all of it, in order.
"""

"""Stage 1: a raw text corpus -> a vocabulary and WebDataset shards (``elmo shard``).

    elmo shard --input 'corpus/*.txt.gz' --output s3://bucket/shards --workers 8 \\
        tokenizer=moses heldout_fraction=0.01 shard_tokens=1000000

Output (the layout is docs/architecture.md, "Shard output format";
:mod:`pipeline.formats.shard_format` and :mod:`pipeline.formats.shard_manifest` read it): ``vocab.txt``, ``vocab_counts.tsv``,
``train-NNNNNN.tar``, ``heldout-NNNNNN.tar``, ``manifest.json`` (written last: the output is
complete when it exists; it holds the line accounting, the removed duplicates and the held-out
baselines: unigram and Kneser-Ney), ``shard_plan.json`` (the counting pass's record, used by
reruns), ``duplicates/`` (the positions each chunk lost, for a pass that reads it again) and, with
``kneser_ney_arpa=true``, ``kneser_ney.arpa.gz``.

Guarantees:

- Same inputs and config (see :data:`.config.RUNTIME_KEYS` for what does not count) -> the same
  bytes in every shard, vocabulary file and manifest, with 1 or N workers and any ``chunk_bytes``.
- Every input line is accounted for in ``manifest.json["lines"]``: kept (train or held out),
  removed as a later copy of a kept sentence (``dedup``), empty, or overlong; lines with invalid UTF-8 are kept with U+FFFD and counted, and so are lines
  whose control characters became spaces (docs/encoding.md, "From text to tokens").
- A rerun over a complete output does nothing; over a partial one it keeps the shards already
  written and writes the rest; over another run's output it refuses (one-line ShardError).
- A run that fails before writing anything (an empty corpus, an unreadable input) leaves no folder
  it created (:func:`pipeline.output_folder.taken_back_on_failure`).

Modules, in the order data flows through them: :mod:`.reader` (chunks of lines),
:mod:`pipeline.formats.tokenizer`, :mod:`.sentences` (line accounting, reserved words), :mod:`.split` (held-out
hash), :mod:`.duplicates` (later copies), :mod:`.vocabulary`, :mod:`.layout` (which sentence goes
to which shard), :mod:`.writer` (shuffle, blocks, tar), :mod:`.baseline` (the Kneser-Ney pass,
over :mod:`.sorted_runs`), :mod:`.manifest`; :mod:`.passes` (per-chunk work), :mod:`.tasks` (the
Ray tasks around it), :mod:`.job` (the Ray shell), :mod:`.resume` (what an earlier run left),
:mod:`.progress` and :mod:`.dashboard` (what a user sees).
"""

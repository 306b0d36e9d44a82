"""EmbedConfig: everything ``elmo embed`` reads, as a typed config (schema -> file -> flags -> key=value).

The embed stage takes no preset: the model size comes from the model's own options.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from pipeline.config import ConfigError, require_at_least, require_choice

LAYER_MODES = ("all", "top", "average")
DTYPES = ("float32", "float16")
LONG_SENTENCE_POLICIES = ("split", "error")
INVALID_UTF8_POLICIES = ("replace", "error")
GPU_CHOICES = ("auto", "true", "false")


@dataclass
class EmbedConfig:
    """Bulk embedding of a corpus with a biLM (``elmo embed``).

    model: folder (local or s3://) holding ``options.json`` + ``weights.hdf5``.
    options_file / weights_file: the two model files named one by one (instead of ``model``).
    input: plain-text files (one tokenized sentence per line; globs allowed) or one shard directory.
    output: folder / s3 prefix for sharded output, or a path ending in ``.hdf5``/``.h5`` for one file.
    layers: ``all`` (N+1, n, 2P), ``top`` (n, 2P) or ``average`` (n, 2P) per sentence.
    dtype: ``float32`` or ``float16`` stored values.
    workers: embedding actors (one GPU each when the cluster has GPUs).
    stateful: carry LSTM states across batches in input order (original behaviour).
    cpus_per_worker: CPUs (and torch threads) per actor.
    use_gpu: ``auto`` (one GPU per actor if the cluster has any), ``true`` or ``false``.
    gpu_share: the fraction of a GPU each actor takes when actors use GPUs.
    lines_per_shard: input lines per output shard.
    batch_tokens: padded token positions per forward pass.
    max_batch_sentences: sentences per forward pass at most.
    stateful_batch_size: sentences per forward pass in stateful mode.
    max_sentence_tokens: longest sentence embedded in one piece.
    long_sentences: ``split`` or ``error`` for longer sentences.
    invalid_utf8: ``replace`` or ``error`` for lines that are not UTF-8.
    shard_splits: splits of a shard directory to embed, in order.
    verify_resume: re-hash complete shards before skipping them on a rerun.
    keep_parts: single-file mode: keep the sharded parts after merging.
    progress: show a progress bar.
    ray_address: Ray cluster to join; empty: ``RAY_ADDRESS`` or an embedded cluster.
    num_cpus: CPUs of an embedded cluster (0: all).
    stop_after_shards: testing only: stop after writing this many shards, as if killed.
    """

    model: str = ""
    """Model folder, local or ``s3://``, holding ``options.json`` and ``weights.hdf5``
    (what ``elmo train`` exports). Leave empty and set ``options_file`` + ``weights_file`` instead."""
    options_file: str = ""
    """The model's options.json (local or s3://); used with ``weights_file`` when ``model`` is empty."""
    weights_file: str = ""
    """The model's HDF5 weights (bilm-tf layout, local or s3://); used with ``options_file``."""
    input: list[str] = field(default_factory=list)
    """Input: plain-text files with one whitespace-tokenized sentence per line (local or s3://,
    globs allowed, read in sorted order as one concatenated corpus), or a single shard directory
    (the shard stage's output, recognised by its manifest.json). A sentence's key is its 0-based
    line number in that concatenation. Compressed files are not accepted: shards are read by byte range."""
    output: str = MISSING
    """Output folder or s3:// prefix (``embeddings-NNNNNN.hdf5`` shards + ``manifest.json``), or a path
    ending in ``.hdf5``/``.h5`` for one AllenNLP-style file (single-file mode)."""
    layers: str = "all"
    """Per-sentence value: ``all`` = (N+1, n_tokens, 2P) [token layer, lstm 1, lstm 2]; ``top`` =
    (n_tokens, 2P) last layer; ``average`` = (n_tokens, 2P) mean of all layers (AllenNLP --all/--top/--average)."""
    dtype: str = "float32"
    """Stored dtype: ``float32`` (AllenNLP's) or ``float16`` (half the bytes; computed in float32)."""
    workers: int = 1
    """Embedding actors in the pool; each loads the model once. Ignored (1) in stateful mode."""
    stateful: bool = False
    """Reproduce the original order-dependent behaviour: LSTM states carry over from batch to batch,
    batches of ``stateful_batch_size`` consecutive non-empty lines run in input order through one
    actor. Off: every sentence's vectors depend only on the sentence and the model."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per actor; torch in the actor uses this many threads (at least 1)."""
    use_gpu: str = "auto"
    """``auto``: one GPU per actor when the cluster has GPUs; ``true``: require them; ``false``: CPU only."""
    gpu_share: float = 1.0
    """GPUs each actor reserves when actors use GPUs: 1 = a GPU of its own; a fraction packs actors onto
    one GPU (0.25: four per GPU). An actor is one process doing its own CPU-side work (reading,
    character ids, HDF5 encoding) between forward passes; on a fast GPU that work, not the GPU, sets
    the pace, so several actors per GPU keep it busy. A fraction must be <= 1; above 1, a whole number."""
    lines_per_shard: int = 1000
    """Input lines per output shard: shard k holds lines [k*lines_per_shard, (k+1)*lines_per_shard).
    The unit of resumption and of memory (one shard's vectors are held at a time per actor)."""
    batch_tokens: int = 4096
    """Token budget of one forward pass: sentences x padded length (boundaries included) stays within
    it; sentences are sorted by length inside a shard so batches carry little padding."""
    max_batch_sentences: int = 256
    """Most sentences in one forward pass, whatever their length."""
    stateful_batch_size: int = 64
    """Sentences per forward pass in stateful mode (AllenNLP's --batch-size, default 64);
    ``lines_per_shard`` must be a multiple of it so batches never straddle shards."""
    max_sentence_tokens: int = 1000
    """Longest sentence (in tokens) embedded in one piece; see ``long_sentences``."""
    long_sentences: str = "split"
    """Longer sentences: ``split`` = embed consecutive pieces of ``max_sentence_tokens`` tokens
    independently and concatenate them (counted as ``split_sentences``); ``error`` = stop with the line number."""
    invalid_utf8: str = "replace"
    """Lines that are not valid UTF-8: ``replace`` bad bytes with U+FFFD (counted as
    ``invalid_utf8_lines``) or ``error`` (stop, naming the line)."""
    shard_splits: list[str] = field(default_factory=lambda: ["train", "heldout"])
    """With a shard directory as input: the splits to embed, concatenated in this order."""
    verify_resume: bool = True
    """On a rerun, re-hash each complete shard against its recorded sha256 before skipping it;
    a mismatch (a damaged file) re-embeds that shard."""
    keep_parts: bool = False
    """Single-file mode: keep the sharded parts folder (``<output>.parts``) after the merge."""
    progress: bool = True
    """Show a progress bar (sentences, tokens/s) on stderr."""
    ray_address: str = ""
    """Ray cluster address; empty: ``RAY_ADDRESS`` or an embedded local cluster."""
    num_cpus: int = 0
    """CPUs of an embedded local cluster; 0: all of this machine's."""
    stop_after_shards: int = 0
    """Testing only: stop the job once this many new shards are written, as if it had been killed
    (0: off). The rerun must then complete the output."""


SINGLE_FILE_SUFFIXES = (".hdf5", ".h5")


def is_single_file(output: str) -> bool:
    """Single-file mode: the output names an HDF5 file rather than a folder/prefix."""
    return output.lower().endswith(SINGLE_FILE_SUFFIXES)


def check_config(cfg) -> None:
    """Reject settings that cannot work, before any work starts (ConfigError naming the key)."""
    for key, allowed in (
        ("layers", LAYER_MODES),
        ("dtype", DTYPES),
        ("long_sentences", LONG_SENTENCE_POLICIES),
        ("invalid_utf8", INVALID_UTF8_POLICIES),
        ("use_gpu", GPU_CHOICES),
    ):
        require_choice(cfg, key, allowed)
    require_at_least(
        cfg,
        (
            "workers",
            "lines_per_shard",
            "batch_tokens",
            "max_batch_sentences",
            "stateful_batch_size",
            "max_sentence_tokens",
        ),
    )
    share = cfg.gpu_share
    if share <= 0 or (share > 1 and share != int(share)):
        raise ConfigError(f"config key 'gpu_share' must be in (0, 1] or a whole number, got {share}")
    if cfg.cpus_per_worker <= 0:
        raise ConfigError(f"config key 'cpus_per_worker' must be > 0, got {cfg.cpus_per_worker}")
    if cfg.stop_after_shards < 0:
        raise ConfigError(f"config key 'stop_after_shards' must be >= 0, got {cfg.stop_after_shards}")
    if cfg.stateful and cfg.lines_per_shard % cfg.stateful_batch_size:
        raise ConfigError(
            f"stateful mode: lines_per_shard ({cfg.lines_per_shard}) must be a multiple of stateful_batch_size "
            f"({cfg.stateful_batch_size}) so that batches never straddle two shards"
        )
    if not str(cfg.output).strip():
        raise ConfigError("config key 'output' is empty; pass --output DIR_OR_S3_PREFIX or a .hdf5 file")

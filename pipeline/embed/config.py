"""EmbedConfig: everything ``elmo embed`` reads, as a typed config (schema -> file -> flags -> key=value).

The embed stage takes no preset: the model size comes from the model's own options.json.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from omegaconf import MISSING

from elmo_model.precision import Precision
from pipeline.config import ConfigError, UseGPU, check_rules
from pipeline.embed.file_format import FileFormat
from pipeline.formats.tokenizer import TokenizerName, moses_lang_rule
from pipeline.tracking.config import WandbConfig


class LayerMode(enum.Enum):
    all = "all"
    """(N+1, n_tokens, 2P): the token layer and every LSTM layer."""
    top = "top"
    """(n_tokens, 2P): the last layer."""
    average = "average"
    """(n_tokens, 2P): the mean of all layers."""


class StoredDType(enum.Enum):
    float32 = "float32"
    float16 = "float16"


class Pool(enum.Enum):
    none = "none"
    """A vector per token."""
    mean = "mean"
    """One vector per sentence: the mean over its tokens of the chosen layers."""


class PoolOver(enum.Enum):
    sentence = "sentence"
    """``pool=mean`` gives a vector per sentence."""
    record = "record"
    """``pool=mean`` gives a vector per record of a record corpus: the mean of its sentences' token vectors."""


class Layout(enum.Enum):
    allennlp = "allennlp"
    """One dataset per sentence, keyed by its input line (AllenNLP's ``elmo`` command)."""
    packed = "packed"
    """Per shard, ``vectors`` (every token, in line order), ``offsets`` and ``lines``: for large corpora."""


class LongSentences(enum.Enum):
    split = "split"
    """Embed consecutive pieces independently and concatenate them."""
    error = "error"
    """Stop, naming the line."""


class InvalidUTF8(enum.Enum):
    replace = "replace"
    """Replace bad bytes with U+FFFD and count the line."""
    error = "error"
    """Stop, naming the line."""


@dataclass
class EmbedConfig:
    """Bulk embedding of a corpus with a biLM (``elmo embed``)."""

    model: str = ""
    """Model folder, local or ``s3://``, holding ``options.json`` and ``weights.hdf5``
    (what ``elmo train`` exports). Leave empty and set ``options_file`` + ``weights_file`` instead."""
    options_file: str = ""
    """The model's options.json (local or s3://); used with ``weights_file`` when ``model`` is empty."""
    weights_file: str = ""
    """The model's HDF5 weights (bilm-tf layout, local or s3://); used with ``options_file``."""
    input: list[str] = field(default_factory=list)
    """Input: plain-text files with one whitespace-tokenized sentence per line (local or s3://,
    globs allowed, read in sorted order as one concatenated corpus), a single shard directory
    (the shard stage's output, recognised by its manifest.json), or record files (Parquet, JSON
    Lines: known by their content) whose documents are split into sentences, each keeping its
    record's id; JSON Lines may be gzip or zstd compressed. A sentence's key is its 0-based line
    number in that concatenation. Compressed text is not accepted: its shards are read by byte range."""
    text_field: str = "text"
    """Record input: the field (JSON Lines) or column (Parquet) that holds a record's document."""
    id_field: str = ""
    """Record input: the field or column of a record's id (a string or an integer), kept beside each
    of its sentences' vectors; empty: a record is known as ``FILE:NUMBER`` (its row or line in its file)."""
    split_sentences: bool = True
    """Record input: split documents into sentences (Bling Fire; docs/benchmarks.md#sentence-splitters-for-documents-benchmarkssentence_splitterspy);
    ``false``: each record is one sentence. Text input is always read a sentence a line."""
    max_record_bytes: int = 16 * 1024 * 1024
    """Record input: JSON Lines lines longer than this are skipped and counted (0: no limit)."""
    tokenizer: TokenizerName = TokenizerName.whitespace
    """How a sentence becomes tokens: ``whitespace`` (text already tokenized, as the shard stage's
    folders are) or ``moses`` (raw text, as documents are: the tokenizer ``elmo shard
    tokenizer=moses`` used for the model's training data)."""
    moses_lang: str = "en"
    """Language code of the Moses tokenizer's rules (only for ``tokenizer=moses``)."""
    output: str = MISSING
    """Output folder or s3:// prefix (``embeddings-NNNNNN.hdf5`` shards + ``manifest.json``), or a path
    ending in ``.hdf5``/``.h5`` for one AllenNLP-style file (single-file mode). A folder must be empty,
    new, or this stage's own output (which a rerun resumes); anything else in it is refused, never
    overwritten. An existing single file is refused unless ``overwrite``."""
    overwrite: bool = False
    """Single-file mode: replace an existing output file (with the new one, once it is complete).
    Only for a ``.hdf5``/``.h5`` output: a folder is never overwritten."""
    layers: LayerMode = LayerMode.all
    """Per-sentence value: ``all`` = (N+1, n_tokens, 2P) [token layer, lstm 1, lstm 2]; ``top`` =
    (n_tokens, 2P) last layer; ``average`` = (n_tokens, 2P) mean of all layers (AllenNLP --all/--top/--average)."""
    dtype: StoredDType = StoredDType.float32
    """Stored dtype: ``float32`` (AllenNLP's) or ``float16`` (half the bytes; computed in float32)."""
    precision: Precision = Precision.float32
    """Compute precision of the forward pass (apart from the stored ``dtype``): ``float32`` (exact),
    ``tf32`` or ``bf16`` (faster on GPUs; ``benchmarks/static_forward.py`` measures their error
    against float32). Stateful runs take float32 only."""
    pool: Pool = Pool.none
    """``mean``: one vector per sentence (the mean over its tokens, boundaries excluded), (N+1, 2P)
    for ``all`` or (2P,) otherwise; an empty line gets zeros."""
    pool_over: PoolOver = PoolOver.sentence
    """With ``pool=mean`` and record input: ``sentence`` (a vector per sentence) or ``record`` (a
    vector per record: the mean of all its sentences' token vectors; read with
    ``pipeline.embed.read_record_vectors``). ``record`` needs ``layout=packed`` or ``format=parquet``."""
    layout: Layout = Layout.allennlp
    """HDF5 shard layout: ``allennlp`` (a dataset per sentence) or ``packed`` (three datasets per shard,
    for large corpora; docs/outputs.md#embeddings). A single-file output is always ``allennlp``."""
    format: FileFormat = FileFormat.hdf5
    """Shard files: ``hdf5`` (``embeddings-NNNNNN.hdf5`` in ``layout``) or ``parquet``
    (``embeddings-NNNNNN.parquet``: columns ``line``, ``tokens``, ``vectors``; docs/outputs.md#embeddings)."""
    workers: int = 1
    """Embedding actors in the pool; each loads the model once. Ignored (1) in stateful mode."""
    stateful: bool = False
    """Reproduce the original order-dependent behaviour: LSTM states carry over from batch to batch,
    batches of ``stateful_batch_size`` consecutive non-empty lines run in input order through one
    actor. Off: every sentence's vectors depend only on the sentence and the model."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per actor; torch in the actor uses this many threads (at least 1)."""
    readers: int = 0
    """Shards being read and prepared at once (decoding, tokenizing, character ids: the CPU side,
    run as tasks beside the actors, ahead of them); 0: the cluster's CPUs not held by actors, at
    least 1 and at most 8 per actor."""
    use_gpu: UseGPU = UseGPU.auto
    """``auto``: one GPU per actor when the cluster has GPUs; ``true``: require them; ``false``: CPU only."""
    gpu_share: float = 1.0
    """GPUs each actor reserves when actors use GPUs: 1 = a GPU of its own; a fraction packs actors onto
    one GPU (0.25: four per GPU). Reading and character ids run in separate tasks and an actor
    encodes one shard while the next one's passes run, so one actor per GPU is the usual choice.
    A fraction must be <= 1; above 1, a whole number."""
    lines_per_shard: int = 1000
    """Input lines per output shard: shard k holds lines [k*lines_per_shard, (k+1)*lines_per_shard)
    (a record corpus: whole records of at least this many sentences, fewer at the end of a planning
    unit). The unit of resumption and of memory (one shard's vectors are held at a time per actor)."""
    batch_tokens: int = 0
    """Token budget of one forward pass: sentences x padded length (boundaries included) stays within
    it; sentences are sorted by length inside a shard so batches carry little padding. 0: 4,096 on a
    CPU; on a GPU what half its free memory holds (8,192 to 131,072: a GPU pass is bound by its
    sequential steps, so more rows cost little; ``pipeline/embed/pass_size.py``)."""
    max_batch_sentences: int = 0
    """Most sentences in one forward pass, whatever their length. 0: 256 on a CPU; on a GPU
    ``batch_tokens`` / 16 (a full pass of the shortest bucket)."""
    stateful_batch_size: int = 64
    """Sentences per forward pass in stateful mode (AllenNLP's --batch-size, default 64);
    ``lines_per_shard`` must be a multiple of it so batches never straddle shards."""
    max_sentence_tokens: int = 1000
    """Longest sentence (in tokens) embedded in one piece; see ``long_sentences``."""
    long_sentences: LongSentences = LongSentences.split
    """Longer sentences: ``split`` = embed consecutive pieces of ``max_sentence_tokens`` tokens
    independently and concatenate them (counted as ``split_sentences``); ``error`` = stop with the line number."""
    invalid_utf8: InvalidUTF8 = InvalidUTF8.replace
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
    resources_timeout_s: float = 900.0
    """On a cluster that autoscales, how long to wait for it to add the actors' resources."""
    stop_after_shards: int = 0
    """Testing only: stop the job once this many new shards are written, as if it had been killed
    (0: off). The rerun must then complete the output."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases: the stage's run in ``wandb.group`` (docs/outputs.md#the-dashboard), offline by
    default into OUTPUT/wandb; ``wandb.mode=disabled`` logs nothing."""

    def __post_init__(self) -> None:
        share = self.gpu_share
        check_rules(
            [
                *((key, getattr(self, key), getattr(self, key) >= 1, ">= 1") for key in _AT_LEAST_ONE),
                (
                    "gpu_share",
                    share,
                    share > 0 and (share <= 1 or share == int(share)),
                    "in (0, 1] or a whole number",
                ),
                ("cpus_per_worker", self.cpus_per_worker, self.cpus_per_worker > 0, "> 0"),
                (
                    "resources_timeout_s",
                    self.resources_timeout_s,
                    math.isfinite(self.resources_timeout_s) and self.resources_timeout_s > 0,
                    "a number of seconds > 0",
                ),
                (
                    "batch_tokens",
                    self.batch_tokens,
                    self.batch_tokens >= 0,
                    ">= 0 (0: chosen for the device)",
                ),
                (
                    "max_batch_sentences",
                    self.max_batch_sentences,
                    self.max_batch_sentences >= 0,
                    ">= 0 (0: chosen for the device)",
                ),
                ("stop_after_shards", self.stop_after_shards, self.stop_after_shards >= 0, ">= 0"),
                ("readers", self.readers, self.readers >= 0, ">= 0 (0: the CPUs the actors leave)"),
                ("text_field", self.text_field, bool(self.text_field), "a field or column name"),
                moses_lang_rule(self.tokenizer, self.moses_lang),
                ("max_record_bytes", self.max_record_bytes, self.max_record_bytes >= 0, ">= 0"),
                (
                    "output",
                    self.output,
                    bool(str(self.output).strip()),
                    "a folder, an s3:// prefix or a .hdf5 file",
                ),
                (
                    "overwrite",
                    self.overwrite,
                    not self.overwrite or self.output == "???" or is_single_file(self.output),
                    "false for a folder output (only a single .hdf5/.h5 file is ever overwritten)",
                ),
            ]
        )
        if self.format is FileFormat.parquet and self.output != "???" and is_single_file(self.output):
            raise ConfigError(
                f"format=parquet writes shards into a folder; output {self.output} is a single .hdf5 file: "
                "use a folder output, or format=hdf5"
            )
        if self.layout is Layout.packed and self.output != "???" and is_single_file(self.output):
            raise ConfigError(
                f"layout=packed writes shards into a folder; output {self.output} is a single .hdf5 file "
                "(always AllenNLP's layout): use layout=allennlp or a folder output"
            )
        if self.pool_over is PoolOver.record and (
            self.pool is not Pool.mean or (self.format is FileFormat.hdf5 and self.layout is Layout.allennlp)
        ):
            raise ConfigError(
                "pool_over=record writes a vector per record: it needs pool=mean, and layout=packed or "
                "format=parquet (AllenNLP's layout keys a vector by its sentence's line)"
            )
        if self.stateful and self.precision is not Precision.float32:
            raise ConfigError(
                f"stateful mode computes in float32 only (precision={self.precision.value} applies to stateless runs); "
                "set precision=float32 or stateful=false"
            )
        if self.stateful and self.lines_per_shard % self.stateful_batch_size:
            raise ConfigError(
                f"stateful mode: lines_per_shard ({self.lines_per_shard}) must be a multiple of stateful_batch_size "
                f"({self.stateful_batch_size}) so that batches never straddle two shards"
            )


_AT_LEAST_ONE = (
    "workers",
    "lines_per_shard",
    "stateful_batch_size",
    "max_sentence_tokens",
)
"""EmbedConfig keys that must be >= 1."""


SINGLE_FILE_SUFFIXES = (".hdf5", ".h5")


def is_single_file(output: str) -> bool:
    """Single-file mode: the output names an HDF5 file rather than a folder/prefix."""
    return output.lower().endswith(SINGLE_FILE_SUFFIXES)

"""ShardConfig: everything the shard stage reads from ``--config``, flags and ``key=value``."""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING

from pipeline.config import check_rules, seed_rule
from pipeline.formats.kneser_ney import MAX_ORDER
from pipeline.formats.tokenizer import TokenizerName, moses_lang_rule
from pipeline.tracking.config import WandbConfig

RUNTIME_KEYS = ("output", "workers", "ray_address", "progress", "chunk_bytes", "wandb")
"""Keys that change how the stage runs but not what it writes; the manifest leaves them out so
that 1 or N workers (or another output path) give byte-identical output."""
RECORD_KEYS = ("input_format", "text_field", "split_sentences", "max_record_bytes")
"""Keys for record corpora: a run's identity names them only when set otherwise than their defaults
(:func:`record_defaults`), so an output written before they existed is still this version's run of
its command."""


class InputFormat(enum.Enum):
    auto = "auto"
    """Each file's kind from its content: Parquet by its magic bytes, JSON Lines by a first ``{``, else text."""
    text = "text"
    """Sentence-per-line text (or, with ``split_sentences=true``, a document a line)."""
    jsonl = "jsonl"
    """JSON Lines: one object a line, its ``text_field`` a document."""
    parquet = "parquet"
    """Parquet: its ``text_field`` column, a document a row."""


@dataclass
class ShardConfig:
    """Stage 1: raw text corpus -> vocabulary + WebDataset shards."""

    input: list[str] = MISSING
    """Input files: paths or globs, local or ``s3://``: text (one sentence per line), JSON Lines or Parquet documents; text and JSON Lines plain, gzip or zstd (known by content, not by name)."""
    heldout_input: list[str] = field(default_factory=list)
    """Extra inputs whose every sentence goes to the held-out split (e.g. a benchmark's test set)."""
    output: str = MISSING
    """Output directory or ``s3://`` prefix; the stage writes vocab.txt, shards and manifest.json into it."""
    input_format: InputFormat = InputFormat.auto
    """``auto`` (each file's kind from its content), ``text``, ``jsonl`` or ``parquet`` for every input."""
    text_field: str = "text"
    """The field (JSON Lines) or column (Parquet) that holds a record's document."""
    split_sentences: Optional[bool] = None  # noqa: UP045 (OmegaConf reads Optional, not ``bool | None``)
    """Split documents into sentences (Bling Fire, chosen in docs/benchmarks.md#sentence-splitters-for-documents-benchmarkssentence_splitterspy); unset: on for records (JSON Lines, Parquet), off for text. ``true`` on text reads a document a line."""
    max_record_bytes: int = 16 * 1024 * 1024
    """Documents longer than this many bytes (a JSON Lines record's line, a text line with ``split_sentences=true``) are dropped and counted as overlong, whatever the chunking; their sentences are then held to ``max_line_bytes``; 0 means no limit."""
    tokenizer: TokenizerName = TokenizerName.whitespace
    """``whitespace`` (input already tokenized) or ``moses`` (raw text; sacremoses)."""
    moses_lang: str = "en"
    """Language code of the Moses tokenizer's rules (only for ``tokenizer=moses``)."""
    lowercase: bool = False
    """Lowercase every sentence after tokenization."""
    heldout_fraction: float = 0.01
    """Fraction of the input's sentences held out, chosen by a hash of the sentence."""
    dedup: bool = True
    """Remove every later copy of a sentence (same text after tokenization and ``lowercase``; each split on its own), as the 1B Word Benchmark did: repeated sentences waste training and flatter held-out perplexity. The first copy in corpus order stays; the manifest counts what went, per split."""
    min_count: int = 3
    """Tokens seen fewer times than this in the training split map to ``<UNK>`` (3: the 1B Word Benchmark's rule and the vocabulary study's choice, docs/training.md#the-vocabulary). A training split with no ``<UNK>`` never trains the softmax row that held-out words outside the vocabulary are scored by; 1 keeps every word, for a corpus whose held-out split has none."""
    max_size: int = 0
    """Largest vocabulary size, the three specials included; 0 means no limit."""
    shard_tokens: int = 250_000
    """Token budget per shard: a shard holds the sentences that start within its budget."""
    block_tokens: int = 4096
    """Token budget per block (one WebDataset sample); a longer sentence gets a block of its own."""
    max_line_bytes: int = 10_000
    """Lines longer than this many bytes (UTF-8, newline excluded) are dropped and counted; 0 means no limit."""
    seed: int = 0
    """Seed of the within-shard shuffle."""
    kneser_ney_orders: list[int] = field(default_factory=lambda: [3])
    """Orders of the held-out Kneser-Ney baselines written into the manifest (each 2..5; ``[]`` turns them off; ``[3,5]`` for the paper's comparison): interpolated modified Kneser-Ney models counted on the training split, scored on the held-out targets the biLM is scored on. Each order's pass reads the training shards once more, each of its tasks holds a group of shards or a partition of their n-grams, and its sorted runs wait under the output's ``kneser_ney/`` folder (about 12 bytes an n-gram; deleted as the pass ends): 800M tokens on 2 cores take 7.4 minutes at order 3; order 5 takes about 5x order 3. See docs/training.md#baselines for its time and memory."""
    kneser_ney_arpa: bool = False
    """Also write the highest order's Kneser-Ney model as ``kneser_ney.arpa.gz``: the ARPA file KenLM, SRILM and speech decoders read (``<s>``, ``</s>``, ``<unk>`` as KenLM names them). Off by default: at the 1B Word Benchmark's size it is gigabytes."""
    chunk_bytes: int = 4 * 1024 * 1024
    """Input bytes per Ray task (4 MiB keeps Ray's per-task cost, about 10 ms of driver and raylet CPU, small next to the task's work); changing it does not change the output."""
    workers: int = 0
    """Ray tasks running at once; 0 means one per CPU of the Ray cluster."""
    ray_address: str = ""
    """Ray cluster to join (``auto``, ``host:port``); empty starts an embedded one (or uses RAY_ADDRESS)."""
    progress: bool = True
    """Show a progress bar on stderr."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases: the stage's run in ``wandb.group`` (docs/outputs.md#the-dashboard), offline by
    default into OUTPUT/wandb; ``wandb.mode=disabled`` logs nothing."""

    def __post_init__(self) -> None:
        check_rules(
            [
                ("heldout_fraction", self.heldout_fraction, 0.0 <= self.heldout_fraction < 1.0, "in [0, 1)"),
                moses_lang_rule(self.tokenizer, self.moses_lang),
                ("min_count", self.min_count, self.min_count >= 1, ">= 1"),
                (
                    "max_size",
                    self.max_size,
                    self.max_size == 0 or self.max_size >= 3,
                    "0 (no limit) or >= 3 (the specials)",
                ),
                ("shard_tokens", self.shard_tokens, self.shard_tokens >= 1, ">= 1"),
                ("block_tokens", self.block_tokens, self.block_tokens >= 1, ">= 1"),
                (
                    "kneser_ney_orders",
                    self.kneser_ney_orders,
                    all(2 <= n <= MAX_ORDER for n in self.kneser_ney_orders)
                    and len(set(self.kneser_ney_orders)) == len(self.kneser_ney_orders),
                    f"distinct orders in 2..{MAX_ORDER} ([] turns the baselines off)",
                ),
                (
                    "kneser_ney_arpa",
                    self.kneser_ney_arpa,
                    not (self.kneser_ney_arpa and not self.kneser_ney_orders),
                    "false when kneser_ney_orders=[] (no model is counted to write)",
                ),
                ("max_line_bytes", self.max_line_bytes, self.max_line_bytes >= 0, ">= 0"),
                ("max_record_bytes", self.max_record_bytes, self.max_record_bytes >= 0, ">= 0"),
                ("text_field", self.text_field, bool(self.text_field), "a field or column name"),
                ("chunk_bytes", self.chunk_bytes, self.chunk_bytes >= 1, ">= 1"),
                ("workers", self.workers, self.workers >= 0, ">= 0"),
                seed_rule(self.seed),
                ("input", self.input, len(self.input) > 0, "at least one path"),
                ("output", self.output, bool(self.output), "a directory or s3:// prefix"),
            ]
        )


@functools.cache
def record_defaults() -> dict:
    """:data:`RECORD_KEYS`' defaults as a run's config records them (a choice by its name)."""
    found = {f.name: f.default for f in dataclasses.fields(ShardConfig) if f.name in RECORD_KEYS}
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in found.items()}

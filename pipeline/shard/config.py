"""ShardConfig: everything the shard stage reads from ``--config``, flags and ``key=value``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pipeline.config import ConfigError

RUNTIME_KEYS = ("output", "workers", "ray_address", "progress", "chunk_bytes")
"""Keys that change how the stage runs but not what it writes; the manifest leaves them out so
that 1 or N workers (or another output path) give byte-identical output."""


@dataclass
class ShardConfig:
    """Stage 1: raw text corpus -> vocabulary + WebDataset shards.

    Fields:
        input: Input files: paths or globs, local or ``s3://``; plain text or gzip (``.gz``), one sentence per line.
        heldout_input: Extra inputs whose every sentence goes to the held-out split (e.g. a benchmark's test set).
        output: Output directory or ``s3://`` prefix; the stage writes vocab.txt, shards and manifest.json into it.
        tokenizer: ``whitespace`` (input already tokenized) or ``moses`` (raw text; sacremoses).
        moses_lang: Language code of the Moses tokenizer's rules (only for ``tokenizer=moses``).
        lowercase: Lowercase every sentence after tokenization.
        heldout_fraction: Fraction of the input's sentences held out, chosen by a hash of the sentence.
        min_count: Tokens seen fewer times than this in the training split map to ``<UNK>``.
        max_size: Largest vocabulary size, the three specials included; 0 means no limit.
        shard_tokens: Token budget per shard: a shard holds the sentences that start within its budget.
        block_tokens: Token budget per block (one WebDataset sample); a longer sentence gets a block of its own.
        max_line_bytes: Lines longer than this many bytes (UTF-8, newline excluded) are dropped and counted; 0 means no limit.
        seed: Seed of the within-shard shuffle.
        chunk_bytes: Input bytes per Ray task (4 MiB keeps Ray's per-task cost, about 10 ms of driver and raylet CPU, small next to the task's work); changing it does not change the output.
        workers: Ray tasks running at once; 0 means one per CPU of the Ray cluster.
        ray_address: Ray cluster to join (``auto``, ``host:port``); empty starts an embedded one (or uses RAY_ADDRESS).
        progress: Show a progress bar on stderr.
    """

    input: list[str] = MISSING
    """Input files: paths or globs, local or ``s3://``; plain text or gzip (``.gz``), one sentence per line."""
    heldout_input: list[str] = field(default_factory=list)
    """Extra inputs whose every sentence goes to the held-out split (e.g. a benchmark's test set)."""
    output: str = MISSING
    """Output directory or ``s3://`` prefix; the stage writes vocab.txt, shards and manifest.json into it."""
    tokenizer: str = "whitespace"
    """``whitespace`` (input already tokenized) or ``moses`` (raw text; sacremoses)."""
    moses_lang: str = "en"
    """Language code of the Moses tokenizer's rules (only for ``tokenizer=moses``)."""
    lowercase: bool = False
    """Lowercase every sentence after tokenization."""
    heldout_fraction: float = 0.01
    """Fraction of the input's sentences held out, chosen by a hash of the sentence."""
    min_count: int = 1
    """Tokens seen fewer times than this in the training split map to ``<UNK>``."""
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
    chunk_bytes: int = 4 * 1024 * 1024
    """Input bytes per Ray task (4 MiB keeps Ray's per-task cost, about 10 ms of driver and raylet CPU, small next to the task's work); changing it does not change the output."""
    workers: int = 0
    """Ray tasks running at once; 0 means one per CPU of the Ray cluster."""
    ray_address: str = ""
    """Ray cluster to join (``auto``, ``host:port``); empty starts an embedded one (or uses RAY_ADDRESS)."""
    progress: bool = True
    """Show a progress bar on stderr."""


def check_config(cfg: Any) -> None:
    """Range checks the types alone cannot express; ConfigError naming the key."""
    from pipeline.shard.tokenizer import TOKENIZERS

    rules = [
        ("tokenizer", cfg.tokenizer in TOKENIZERS, f"one of {', '.join(TOKENIZERS)}"),
        ("heldout_fraction", 0.0 <= cfg.heldout_fraction < 1.0, "in [0, 1)"),
        ("min_count", cfg.min_count >= 1, ">= 1"),
        ("max_size", cfg.max_size == 0 or cfg.max_size >= 3, "0 (no limit) or >= 3 (the specials)"),
        ("shard_tokens", cfg.shard_tokens >= 1, ">= 1"),
        ("block_tokens", cfg.block_tokens >= 1, ">= 1"),
        ("max_line_bytes", cfg.max_line_bytes >= 0, ">= 0"),
        ("chunk_bytes", cfg.chunk_bytes >= 1, ">= 1"),
        ("workers", cfg.workers >= 0, ">= 0"),
        ("input", len(cfg.input) > 0, "at least one path"),
        ("output", bool(cfg.output), "a directory or s3:// prefix"),
    ]
    for key, ok, expected in rules:
        if not ok:
            raise ConfigError(f"config key {key!r} must be {expected}, got {getattr(cfg, key)!r}")

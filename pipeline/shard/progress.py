"""Progress reporting: a tqdm bar per pass (lines and tokens/s) and the final summary."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from pipeline.formats.shard_manifest import LineCounts, ShardManifest


class Progress:
    """A bar counting lines (or another ``unit``), with the token rate as its postfix where tokens
    are counted; silent when disabled."""

    def __init__(self, desc: str, enabled: bool, total_lines: int | None = None, unit: str = " lines"):
        self.start = time.perf_counter()
        self.tokens = 0
        self.bar = tqdm(
            desc=desc,
            total=total_lines,
            unit=unit,
            unit_scale=unit == " lines",
            disable=not enabled,
            file=sys.stderr,
            leave=True,
        )

    def update(self, lines: int, tokens: int = 0) -> None:
        self.tokens += tokens
        self.bar.update(lines)
        if self.tokens:
            self.bar.set_postfix_str(
                f"{format_rate(self.tokens, time.perf_counter() - self.start)} tokens/s", refresh=False
            )

    def close(self) -> None:
        self.bar.close()


class BaselineBars:
    """The Kneser-Ney pass's two bars, one after the other: training lines counted, then its
    partitions' steps (adjust, then score: ``2 * parts``)."""

    def __init__(self, order: int, parts: int, enabled: bool):
        self.desc, self.parts, self.enabled = f"shard: {order}-gram baseline", parts, enabled
        self.counting = Progress(f"{self.desc}, counting", enabled)
        self.partitions: Progress | None = None

    def counted(self, lines: int, tokens: int) -> None:
        self.counting.update(lines, tokens)

    def partition(self) -> None:
        if self.partitions is None:
            self.counting.close()
            self.partitions = Progress(
                f"{self.desc}, {self.parts} partitions", self.enabled, 2 * self.parts, unit=" steps"
            )
        self.partitions.update(1)

    def close(self) -> None:
        self.counting.close()
        if self.partitions is not None:
            self.partitions.close()


def format_rate(count: float, seconds: float) -> str:
    rate = count / seconds if seconds > 0 else 0.0
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.2f}{unit}"
    return f"{rate:.0f}"


def summary(
    manifest: ShardManifest,
    seconds: float,
    reused: int = 0,
    baseline_seconds: float = 0.0,
    dedup_seconds: float | None = None,
) -> str:
    """A few lines describing a finished run, for stdout (``baseline_seconds``: the Kneser-Ney
    pass's share of ``seconds``; ``dedup_seconds``: the deduplicating pass's, None where it did not
    run: a rerun from the plan). ``manifest``: the one the run just wrote (its line record)."""
    lines, totals = manifest.lines, manifest.totals
    if lines is None:
        raise ValueError("summary: the manifest has no line record (not one this shard stage wrote)")
    tokens = totals["train"].tokens + totals["heldout"].tokens
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(lines.skipped.items()))
    parts = [f"shard: wrote {manifest.folder} in {seconds:.1f}s ({format_rate(tokens, seconds)} tokens/s)"]
    if lines.documents is not None:
        parts.append(_documents_line(manifest, lines))
    parts += [
        f"  {'sentences split' if lines.documents is not None else 'lines read'} {lines.read}: skipped {skipped}; {lines.invalid_utf8_replaced} with invalid UTF-8 replaced, "
        f"{lines.control_chars_replaced} with control characters replaced",
    ]
    parts.append(_duplicates_line(manifest, lines, dedup_seconds))
    for split in ("train", "heldout"):
        t = totals[split]
        parts.append(
            f"  {split}: {t.sentences} sentences, {t.tokens} tokens ({t.unk_tokens} <UNK>: "
            f"{t.unk_rate:.2%}), {t.shards} shards"
        )
    parts.append(
        f"  vocabulary: {manifest.vocab.size} entries ({manifest.vocab.distinct_train_tokens} distinct training tokens)"
    )
    parts.append(_baseline_line(manifest, baseline_seconds))
    if reused:
        parts.append(f"  reused {reused} shards already written by an earlier run")
    warning = manifest.unlearnable_unk()
    if warning:
        parts.append(warning)
    return "\n".join(parts)


def _documents_line(manifest: ShardManifest, lines: LineCounts) -> str:
    """The documents a record corpus held and those skipped (in which input first)."""
    how = (
        "split into sentences"
        if manifest.settings.split_sentences is not False
        else "a line each (split_sentences=false)"
    )
    line = f"  documents read {lines.documents}, {how}"
    if lines.records_skipped:
        path, number = lines.first_skipped or ("?", "?")
        line += (
            f"; warning: {lines.records_skipped} records skipped (no string field {manifest.settings.text_field!r}, "
            f"or not a JSON object), the first {path} record {number}"
        )
    return line


def _duplicates_line(manifest: ShardManifest, lines: LineCounts, seconds: float | None) -> str:
    if not manifest.settings.dedup:
        return "  duplicates: kept (dedup=false)"
    said = ", ".join(
        f"{split} {lines.duplicates[split][0]} sentences ({lines.duplicates[split][1]} tokens)"
        for split in ("train", "heldout")
    )
    return f"  duplicates removed: {said}" + ("" if seconds is None else f" (its pass {seconds:.1f}s)")


def _baseline_line(manifest: ShardManifest, seconds: float) -> str:
    unigram = manifest.unigram_perplexity
    if unigram is None:
        arpa = manifest.settings.kneser_ney_arpa  # asked for, but no model was counted
        return "  held-out baselines: none (nothing held out)" + (
            "; no ARPA file either: the Kneser-Ney model is counted only beside a held-out split"
            if arpa
            else ""
        )
    line = f"  held-out baselines: unigram perplexity {unigram:,.1f}"
    models = manifest.kneser_ney
    if models:
        line += ", Kneser-Ney " + ", ".join(f"{kn.order}-gram {kn.perplexity:,.1f}" for kn in models)
        line += f" ({'its pass' if len(models) == 1 else 'their passes'} {seconds:.1f}s)"
        arpa = next((kn.arpa for kn in models if kn.arpa is not None), None)
        if arpa is not None:
            line += f"; the {models[-1].order}-gram model as ARPA: {arpa.file} ({arpa.bytes / 1e6:,.1f} MB)"
    return line

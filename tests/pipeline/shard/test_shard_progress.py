"""The shard stage's bars and summary (pipeline/shard/progress.py)."""

from __future__ import annotations

import math

from pipeline.formats.shard_manifest import ShardManifest
from pipeline.shard.progress import Progress, format_rate, summary

SHA = "ab" * 32
MANIFEST = {
    "config": {"dedup": True},
    "lines": {"read": 12, "skipped": {"overlong": 1, "empty": 2}, "invalid_utf8_replaced": 3,
              "control_chars_replaced": 0,
              "duplicates": {"train": {"sentences": 2, "tokens": 7}, "heldout": {"sentences": 0, "tokens": 0}}},
    "totals": {
        "train": {"sentences": 8, "tokens": 1_500_000, "unk_tokens": 4},
        "heldout": {"sentences": 1, "tokens": 500_000, "unk_tokens": 0},
    },
    "vocab": {"file": "vocab.txt", "counts_file": "vocab_counts.tsv", "size": 900, "sha256": SHA,
              "distinct_train_tokens": 1200},
    "shards": {
        "train": [{"name": f"train-00000{i}.tar", "sentences": 4, "tokens": 750_000, "sha256": SHA} for i in (0, 1)],
        "heldout": [{"name": "heldout-000000.tar", "tokens": 9, "sentences": 1, "sha256": SHA,
                     "unigram_nll": 10 * math.log(80.0)}],
    },
    "format_version": 2,
    "baselines": {"kneser_ney": [{"order": 4, "perplexity": 31.04, "targets": 10}]},
}  # fmt: skip


def _summary(record: dict, folder: str = "out", seconds: float = 4.0, **kwargs) -> str:
    return summary(ShardManifest.of(record, folder), seconds, **kwargs)


def test_rates_read_in_thousands_millions_and_billions():
    assert [format_rate(n, 1.0) for n in (12, 999, 1_500, 2_345_678, 7e9)] == [
        "12",
        "999",
        "1.50k",
        "2.35M",
        "7.00G",
    ]
    assert format_rate(10, 0.0) == "0"


def test_the_summary_says_where_the_shards_are_and_accounts_for_every_line():
    text = _summary(MANIFEST, "s3://b/shards", reused=2)
    assert text.splitlines()[0] == "shard: wrote s3://b/shards in 4.0s (500.00k tokens/s)"
    assert "lines read 12: skipped 2 empty, 1 overlong; 3 with invalid UTF-8 replaced" in text
    assert "  train: 8 sentences, 1500000 tokens (4 <UNK>: 0.00%), 2 shards" in text
    assert "warning" not in text  # held-out words all in the vocabulary: the <UNK> row scores none
    assert "  duplicates removed: train 2 sentences (7 tokens), heldout 0 sentences (0 tokens)" in text
    assert "heldout 0 sentences (0 tokens) (its pass 0.7s)" in _summary(MANIFEST, dedup_seconds=0.7)
    kept = _summary({**MANIFEST, "config": {"dedup": False}})
    assert "  duplicates: kept (dedup=false)" in kept and "removed" not in kept
    arpa = {
        "order": 5,
        "perplexity": 30.5,
        "targets": 10,
        "arpa": {"file": "kneser_ney.arpa.gz", "bytes": 2_500_000, "sha256": SHA},
    }
    both = [MANIFEST["baselines"]["kneser_ney"][0], arpa]
    with_arpa = _summary({**MANIFEST, "baselines": {"kneser_ney": both}}, baseline_seconds=2.0)
    assert (
        "Kneser-Ney 4-gram 31.0, 5-gram 30.5 (their passes 2.0s); the 5-gram model as ARPA: "
        "kneser_ney.arpa.gz (2.5 MB)" in with_arpa
    )
    assert "  vocabulary: 900 entries (1200 distinct training tokens)" in text
    assert text.endswith("reused 2 shards already written by an earlier run")
    assert (
        "  held-out baselines: unigram perplexity 80.0, Kneser-Ney 4-gram 31.0 (its pass 1.5s)"
        in _summary(MANIFEST, baseline_seconds=1.5)
    )
    nothing_held_out = {**MANIFEST, "shards": {**MANIFEST["shards"], "heldout": []}, "baselines": {}}
    assert "  held-out baselines: none (nothing held out)" in _summary(nothing_held_out)
    # issue 65, item 18: an ARPA file asked for and not written was not said
    arpa_asked = {**nothing_held_out, "config": {"dedup": True, "kneser_ney_arpa": True}}
    assert "none (nothing held out); no ARPA file either" in _summary(arpa_asked)
    assert "reused" not in _summary(MANIFEST)


def test_a_disabled_bar_prints_nothing_and_still_counts(capsys):
    bar = Progress("count", enabled=False, total_lines=10)
    bar.update(4, 100)
    bar.update(6, 50)
    bar.close()
    assert bar.tokens == 150
    assert capsys.readouterr().err == ""


def test_a_training_split_without_unk_beside_held_out_unk_ends_the_summary_with_one_warning():
    totals = {
        "train": {"sentences": 8, "tokens": 1_500_000, "unk_tokens": 0, "shards": 2},
        "heldout": {"sentences": 1, "tokens": 500, "unk_tokens": 20, "shards": 1},
    }
    text = _summary({**MANIFEST, "totals": totals, "config": {"dedup": True, "min_count": 1}})
    assert "  heldout: 1 sentences, 500 tokens (20 <UNK>: 4.00%), 1 shards" in text
    last = text.splitlines()[-1]
    assert last.startswith("warning: the training split has no <UNK> while 20 of 500 held-out tokens (4.0%)")
    assert "(min_count=1)" in last and sum("warning" in line for line in text.splitlines()) == 1

"""The shard stage end to end on a slice of the sample corpus, locally and on the S3 test server."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from jobs.shard import main as shard_main
from pipeline.config import load_config
from pipeline.formats import kneser_ney
from pipeline.formats import shard_format as fmt
from pipeline.formats.shard_manifest import ShardManifest, read_manifest
from pipeline.formats.unigram import heldout_unigram_perplexity
from pipeline.runtime import storage
from pipeline.shard import job as shard_job
from pipeline.shard import resume as shard_resume
from pipeline.shard.config import ShardConfig
from pipeline.shard.errors import ShardError
from pipeline.shard.reader import iter_chunks
from pipeline.shard.split import heldout_threshold, is_heldout
from pipeline.shard.stage import SHARD
from pipeline.stage import run_stage
from pipeline.tracking import offline_reader

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "pipeline" / "data" / "kjv-sample.txt.gz"
LINES = 2500
SETTINGS = {
    "heldout_fraction": 0.05,
    "shard_tokens": 15000,
    "block_tokens": 1000,
    "progress": False,
    "wandb.mode": "disabled",  # the stage's wandb run: test_the_shard_run_is_on_the_dashboard
}


def run_shard(cfg, session=None):
    """The stage as its entry point runs it: the work, the dashboard, the closing lines."""
    return run_stage(SHARD, cfg, session)


def _config(inputs, output, **overrides) -> ShardConfig:
    values = {**SETTINGS, **overrides}
    items = [f"input=[{','.join(repr(str(i)) for i in inputs)}]", f"output='{output}'"]
    items += [f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in values.items()]
    return load_config(ShardConfig, overrides=items)


def run(inputs, output, **overrides) -> dict:
    """The manifest of a shard run as written (the JSON object); its StageResult's details hold
    the same, typed."""
    result = run_shard(_config(inputs, output, **overrides))
    written = json.loads(storage.read_bytes(storage.join(str(output), fmt.MANIFEST_FILE)))
    assert result.details.manifest == ShardManifest.of(written, str(output))
    return written


def typed(out, manifest: dict) -> ShardManifest:
    return ShardManifest.of(manifest, str(out))


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every output file but the plan (the one file that records the chunking) and the positions
    of the duplicates (kept per chunk): name -> bytes."""
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != "shard_plan.json"
    }


def first_copies(lines: list[str], threshold: int) -> dict[str, list[str]]:
    """Per split, the first copy of each normalised sentence, in corpus order (what dedup keeps)."""
    kept: dict[str, dict[str, None]] = {"train": {}, "heldout": {}}
    for line in lines:
        sentence = " ".join(line.split())
        if sentence:
            kept["heldout" if is_heldout(sentence, threshold) else "train"].setdefault(sentence)
    return {split: list(sentences) for split, sentences in kept.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(LINES)]
    path = tmp_path_factory.mktemp("corpus") / "kjv-slice.txt.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), mtime=0))
    return path, lines


@pytest.fixture(scope="module")
def baseline(ray_local, corpus, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("baseline") / "shards"
    manifest = run([corpus[0]], out, workers=1, chunk_bytes=1 << 20)
    return out, manifest


def _all_sentences(out: Path, manifest: dict, split: str) -> list[fmt.Block]:
    return [b for url in typed(out, manifest).urls(split) for b in fmt.read_shard(url)]


def test_shards_hold_every_sentence_once_with_matching_ids(baseline, corpus):
    out, manifest = baseline
    _, lines = corpus
    vocab = fmt.read_vocab(str(out / "vocab.txt"))
    index = {t: i for i, t in enumerate(vocab)}
    seen = {}
    for split in fmt.SPLITS:
        blocks = _all_sentences(out, manifest, split)
        seen[split] = [" ".join(s) for b in blocks for s in b.sentences]
        for block in blocks:
            assert block.num_tokens <= SETTINGS["block_tokens"]
            for tokens, ids in zip(block.sentences, block.sentence_ids(), strict=True):
                assert ids.tolist() == [index.get(t, index["<UNK>"]) for t in tokens]
        assert len(seen[split]) == manifest["totals"][split]["sentences"]
        assert sum(len(s.split()) for s in seen[split]) == manifest["totals"][split]["tokens"]
    # every sentence once, the held-out split exactly those whose hash falls below the threshold
    threshold = heldout_threshold(SETTINGS["heldout_fraction"])
    unique = first_copies(lines, threshold)
    assert sorted(seen["train"]) == sorted(unique["train"]) and sorted(seen["heldout"]) == sorted(
        unique["heldout"]
    )
    removed = manifest["lines"]["duplicates"]
    assert (
        removed["train"]["sentences"]
        == len(lines) - len(unique["train"]) - len(unique["heldout"]) - (removed["heldout"]["sentences"])
        == 8
    )  # Exodus's "And the LORD spake unto Moses, saying," and others
    assert 0.02 < len(seen["heldout"]) / len(lines) < 0.08
    # shuffled within shards: not in input order
    assert seen["train"][:50] != unique["train"][:50]


def test_vocabulary_order_specials_and_counts(baseline):
    out, manifest = baseline
    counts = fmt.read_counts(str(out / "vocab_counts.tsv"))
    tokens = [t for t, _ in counts]
    assert tokens == fmt.read_vocab(str(out / "vocab.txt"))
    assert tokens[:3] == ["<S>", "</S>", "<UNK>"]
    train = manifest["totals"]["train"]
    assert counts[0][1] == counts[1][1] == train["sentences"]
    body = counts[3:]
    assert body == sorted(body, key=lambda tc: (-tc[1], tc[0].encode("utf-8")))
    assert sum(c for _, c in counts[2:]) == train["tokens"]
    assert manifest["vocab"]["size"] == len(tokens)
    assert manifest["vocab"]["sha256"] == hashlib.sha256((out / "vocab.txt").read_bytes()).hexdigest()


def test_manifest_accounts_for_every_line(baseline):
    out, manifest = baseline
    lines = manifest["lines"]
    assert lines["read"] == LINES
    removed = sum(lines["duplicates"][split]["sentences"] for split in fmt.SPLITS)
    assert (
        lines["read"]
        == lines["sentences"]["train"]
        + lines["sentences"]["heldout"]
        + sum(lines["skipped"].values())
        + removed
    )
    for split in fmt.SPLITS:
        shards = manifest["shards"][split]
        assert manifest["totals"][split]["tokens"] == sum(s["tokens"] for s in shards)
        assert manifest["totals"][split]["sentences"] == lines["sentences"][split]
        for shard in shards:
            digest = hashlib.sha256((out / shard["name"]).read_bytes()).hexdigest()
            assert shard["sha256"] == digest
    assert len(manifest["shards"]["train"]) >= 3
    longest = lines["longest_sentence_tokens"]
    assert all(7500 - longest < s["tokens"] < 22500 + longest for s in manifest["shards"]["train"])
    assert manifest["inputs_detail"][0]["lines"] == LINES
    assert "workers" not in manifest["config"] and manifest["config"]["shard_tokens"] == 15000


def test_the_manifest_records_the_heldout_unigram_baseline(baseline):
    out, manifest = baseline
    recorded = typed(out, manifest).unigram_perplexity
    unscored = {  # as a shard stage before the unigram's record wrote it: no version, no unigram_nll
        **{k: v for k, v in manifest.items() if k != "format_version"},
        "shards": {
            **manifest["shards"],
            "heldout": [
                {k: v for k, v in r.items() if k != "unigram_nll"} for r in manifest["shards"]["heldout"]
            ],
        },
    }
    from_shards = heldout_unigram_perplexity(typed(out, unscored))
    assert recorded == pytest.approx(from_shards, rel=1e-9) and 1 < recorded < manifest["vocab"]["size"]
    assert all("unigram_nll" not in r for r in manifest["shards"]["train"])


def _ids_and_lengths(blocks: list[fmt.Block]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([b.ids for b in blocks]), np.concatenate([b.lengths for b in blocks])


def test_the_manifest_records_the_kneser_ney_baseline_of_its_shards(baseline):
    # the Ray pass (groups of shards counted, each partition's runs merged) against one count of the whole
    out, manifest = baseline
    (record,) = manifest["baselines"]["kneser_ney"]
    whole = kneser_ney.count_ngrams(*_ids_and_lengths(_all_sentences(out, manifest, "train")), 3)
    model = kneser_ney.build(whole, manifest["vocab"]["size"])
    nll, targets = model.score(*_ids_and_lengths(_all_sentences(out, manifest, "heldout")))
    heldout = manifest["totals"]["heldout"]
    assert record["order"] == 3 and record["targets"] == targets == heldout["tokens"] + heldout["sentences"]
    assert record["nll"] == pytest.approx(nll, rel=1e-12) and record["ngrams"] == model.ngrams
    assert record["perplexity"] == pytest.approx(kneser_ney.perplexity(nll, targets), rel=1e-12)
    assert record["perplexity"] < typed(out, manifest).unigram_perplexity  # same targets, more context


@pytest.mark.slow
def test_the_manifests_kneser_ney_perplexity_is_kenlms_on_the_shards_text(ray_local, corpus, kenlm, tmp_path):
    """The peer check end to end: KenLM's lmplz on the training split as the stage wrote it (its
    duplicates removed), its query module on the held-out split's sentences. With every training
    word in the vocabulary (``min_count=1``): lmplz refuses ``<unk>`` in its text and so never trains
    one, while the default vocabulary's ``<UNK>`` is a trained word (that model is checked against
    KenLM as ARPA below)."""
    out = tmp_path / "every-word"
    manifest = run([corpus[0]], out, min_count=1)
    assert manifest["totals"]["train"]["unk_tokens"] == 0
    text = tmp_path / "train.txt"
    text.write_text(
        "".join(" ".join(s) + "\n" for b in _all_sentences(out, manifest, "train") for s in b.sentences),
        encoding="utf-8",
    )
    kenlm.estimate(text, 3, tmp_path / "model.arpa", tmp_path)
    model = kenlm.query_module().Model(str(tmp_path / "model.arpa"))
    heldout = [" ".join(s) for b in _all_sentences(out, manifest, "heldout") for s in b.sentences]
    log10 = [lp for sentence in heldout for lp, _, _ in model.full_scores(sentence, bos=True, eos=True)]
    (record,) = manifest["baselines"]["kneser_ney"]
    assert record["targets"] == len(log10)
    assert record["perplexity"] == pytest.approx(10 ** (-sum(log10) / len(log10)), rel=1e-6)


@pytest.mark.slow
def test_the_model_as_arpa_is_read_by_kenlm_with_the_manifests_perplexity(
    ray_local, corpus, kenlm, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(kneser_ney, "MIN_PART_TOKENS", 20_000)  # written from several partitions
    out = tmp_path / "arpa"
    manifest = run([corpus[0]], out, kneser_ney_arpa=True, workers=2, kneser_ney_orders=[2, 3])
    two, record = manifest["baselines"]["kneser_ney"]  # the highest order's model is the one written
    assert two["order"] == 2 and "arpa" not in two
    assert record["partitions"] > 1 and record["arpa"]["file"] == "kneser_ney.arpa.gz"
    path = out / "kneser_ney.arpa.gz"
    assert record["arpa"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["arpa"]["bytes"] == path.stat().st_size
    assert "the 3-gram model as ARPA: kneser_ney.arpa.gz" in capsys.readouterr().out
    model = kenlm.query_module().Model(str(path))
    heldout = [" ".join(s) for b in _all_sentences(out, manifest, "heldout") for s in b.sentences]
    log10 = [lp for sentence in heldout for lp, _, _ in model.full_scores(sentence, bos=True, eos=True)]
    assert record["perplexity"] == pytest.approx(10 ** (-sum(log10) / len(log10)), rel=1e-6)
    assert model.order == 3
    # off by default
    assert "arpa" not in run([corpus[0]], tmp_path / "plain")["baselines"]["kneser_ney"][0]
    assert not (tmp_path / "plain" / "kneser_ney.arpa.gz").exists()


def test_the_kneser_ney_baseline_is_the_same_in_partitions(baseline, corpus, tmp_path, monkeypatch):
    out, manifest = baseline
    monkeypatch.setattr(kneser_ney, "MIN_PART_TOKENS", 10_000)  # a partition per 10k tokens: several here
    (record,) = run([corpus[0]], tmp_path / "parts", workers=2)["baselines"]["kneser_ney"]
    assert not (tmp_path / "parts" / "kneser_ney").exists()  # its scratch files: gone with the pass
    (whole,) = manifest["baselines"]["kneser_ney"]
    assert (
        whole["partitions"] == 1
        and record["partitions"] == manifest["totals"]["train"]["tokens"] // 10_000 > 1
    )
    assert record["nll"] == pytest.approx(whole["nll"], rel=1e-12)
    assert {k: v for k, v in record.items() if k not in ("nll", "perplexity", "partitions")} == {
        k: v for k, v in whole.items() if k not in ("nll", "perplexity", "partitions")
    }


def test_no_kneser_ney_orders_count_no_baseline(ray_local, corpus, tmp_path, capsys):
    manifest = run([corpus[0]], tmp_path / "off", kneser_ney_orders=[])
    assert manifest["baselines"] == {}
    out = capsys.readouterr().out
    assert "held-out baselines: unigram perplexity" in out and "Kneser-Ney" not in out


def test_each_kneser_ney_order_is_a_model_of_its_own(baseline, corpus, tmp_path, capsys):
    """``kneser_ney_orders=[5,2]``: a 2-gram and a 5-gram, ascending, each the model one count of
    the whole training split at its order makes (not the 5-gram's lower orders)."""
    out = tmp_path / "two"
    manifest = run([corpus[0]], out, kneser_ney_orders=[5, 2])
    records = manifest["baselines"]["kneser_ney"]
    assert [r["order"] for r in records] == [2, 5] and manifest["format_version"] == 2
    train = _ids_and_lengths(_all_sentences(out, manifest, "train"))
    heldout = _ids_and_lengths(_all_sentences(out, manifest, "heldout"))
    for record in records:
        model = kneser_ney.build(kneser_ney.count_ngrams(*train, record["order"]), manifest["vocab"]["size"])
        assert record["perplexity"] == pytest.approx(kneser_ney.perplexity(*model.score(*heldout)), rel=1e-12)
    assert records[1]["perplexity"] < records[0]["perplexity"]
    summary = capsys.readouterr().out
    assert (
        f"Kneser-Ney 2-gram {records[0]['perplexity']:,.1f}, 5-gram {records[1]['perplexity']:,.1f} (their passes"
        in summary
    )


def test_each_splits_unk_rate_is_recorded_and_an_unlearnable_unk_is_one_warning(
    ray_local, corpus, tmp_path, capsys
):
    """The default vocabulary (``min_count=3``) leaves rare words to ``<UNK>`` in both splits;
    ``min_count=1`` gives the training split none while held-out words are new: one line says so."""
    manifest = run([corpus[0]], tmp_path / "default")
    totals = manifest["totals"]
    for split in fmt.SPLITS:
        assert totals[split]["unk_tokens"] > 0
        assert totals[split]["unk_rate"] == totals[split]["unk_tokens"] / totals[split]["tokens"]
    said = capsys.readouterr().out
    assert f"({totals['heldout']['unk_tokens']} <UNK>: {totals['heldout']['unk_rate']:.2%})" in said
    assert "warning" not in said
    every_word = run([corpus[0]], tmp_path / "every-word", min_count=1)["totals"]
    assert every_word["train"]["unk_tokens"] == 0 < every_word["heldout"]["unk_tokens"]
    (warning,) = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert warning.startswith("warning: the training split has no <UNK> while") and "min_count=1" in warning


def test_byte_identical_with_two_workers_and_other_chunking(baseline, corpus, tmp_path):
    out, _ = baseline
    other = tmp_path / "two"
    run([corpus[0]], other, workers=2, chunk_bytes=20000)
    assert snapshot(other) == snapshot(out)


def test_the_shard_run_is_on_the_dashboard_and_a_rerun_adds_none(ray_local, corpus, tmp_path, capsys):
    out = tmp_path / "shards"
    result = run_shard(_config([corpus[0]], out, workers=2, **{"wandb.mode": "offline", "wandb.group": "g1"}))
    manifest = json.loads((out / fmt.MANIFEST_FILE).read_text())
    (path,) = offline_reader.run_files(out / "wandb")
    recs = offline_reader.records(path)
    run = offline_reader.run_record(recs)
    assert (run["run_group"], run["job_type"], run["display_name"]) == ("g1", "shard", "g1-shard")
    got = offline_reader.summary(recs)
    for split in fmt.SPLITS:
        for key in ("sentences", "tokens", "shards"):
            assert got[f"{split}/{key}"] == manifest["totals"][split][key]
        assert got[f"{split}/duplicate_sentences"] == manifest["lines"]["duplicates"][split]["sentences"]
    assert got["vocab/size"] == manifest["vocab"]["size"]
    assert got["baselines/unigram_perplexity"] == pytest.approx(result.details.manifest.unigram_perplexity)
    assert (
        got["baselines/kneser_ney_3gram_perplexity"] == manifest["baselines"]["kneser_ney"][0]["perplexity"]
    )
    assert offline_reader.config(recs)["kneser_ney_orders"] == [3]
    assert got["heldout/unk_rate"] == manifest["totals"]["heldout"]["unk_rate"]
    # the output as a dataset artifact: the manifest and vocabulary checked, every shard listed
    (artifact,) = offline_reader.artifacts(recs)
    name = f"{out.parent.parent.name}-{out.parent.name}-{out.name}"
    assert (artifact["artifact_type"], artifact["name"]) == ("dataset", name)
    shards = [r["name"] for split in fmt.SPLITS for r in manifest["shards"][split]]
    contents = {c["path"]: c["ref"] for c in artifact["manifest"]["contents"]}
    assert sorted(contents) == sorted(["manifest.json", "vocab.txt", *shards])
    assert contents["manifest.json"] == f"file://{out}/manifest.json"
    assert f"upload it with: {result.wandb_sync}" in capsys.readouterr().out
    # the output is still the stage's own, and a rerun that finds it complete logs no second run
    again = run_shard(_config([corpus[0]], out, **{"wandb.mode": "offline", "wandb.group": "g1"}))
    assert again.tokens == 0 and again.wandb_sync is None
    assert [p.name for p in (out / "wandb").iterdir()] == ["attempt-001"]


def test_rerun_does_nothing_and_a_partial_output_is_completed(baseline, corpus, tmp_path, capsys):
    out = tmp_path / "partial"
    run([corpus[0]], out, workers=2, chunk_bytes=50000)
    before = snapshot(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    run([corpus[0]], out, workers=2)
    assert "nothing to do" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    # a killed writing pass: a shard and the manifest are missing; the others are kept, not rewritten
    # (a pass killed in its Kneser-Ney step leaves its scratch files too: deleted by the rerun)
    (out / "manifest.json").unlink()
    (out / "train-000001.tar").unlink()
    (out / "kneser_ney").mkdir()
    (out / "kneser_ney" / "counts-g000003-p0001.tables").write_bytes(b"half a run")
    kept = (out / "train-000000.tar").stat().st_mtime_ns
    capsys.readouterr()
    run([corpus[0]], out, workers=1, chunk_bytes=50000)
    tars = [name for name in before if name.endswith(".tar")]
    assert f"reused {len(tars) - 1} shards" in capsys.readouterr().out
    assert snapshot(out) == before and not (out / "kneser_ney").exists()
    assert (out / "train-000000.tar").stat().st_mtime_ns == kept
    # a shard that is not a readable tar is rewritten
    (out / "manifest.json").unlink()
    (out / "train-000002.tar").write_bytes(b"garbage")
    run([corpus[0]], out, workers=2, chunk_bytes=50000)
    assert snapshot(out) == before
    # without a readable plan or manifest, shard_run.json still says whose shards these are:
    # counted again, and the same bytes
    (out / "manifest.json").unlink()
    storage.write_bytes(str(out / "shard_plan.json"), b"{}")
    run([corpus[0]], out, workers=2, chunk_bytes=50000)
    assert snapshot(out) == before
    # without shard_run.json, nothing vouches for the files there: refused, not written over
    (out / "shard_run.json").unlink()
    with pytest.raises(ShardError, match=r"holds \S+ but no shard_run.json: not an elmo shard output"):
        run([corpus[0]], out, workers=2, chunk_bytes=50000)


def test_writing_pass_reads_again_only_inputs_whose_chunks_were_not_kept(
    ray_local, corpus, baseline, tmp_path, monkeypatch
):
    reads = []

    def recording(paths, *args, **kwargs):
        reads.append([str(p) for p in paths])
        return iter_chunks(paths, *args, **kwargs)

    monkeypatch.setattr(shard_job, "iter_chunks", recording)  # the counting pass
    monkeypatch.setattr(shard_resume, "iter_chunks", recording)  # the writing pass's reads again
    held = tmp_path / "held.txt"
    held.write_text("a small held-out input\nof two lines\n")
    # the corpus is one chunk, kept in the object store; the held-out input's is too small to keep:
    # read again to write it (not to remove duplicates: it has none)
    run([corpus[0]], tmp_path / "mixed", heldout_input=[str(held)], chunk_bytes=1 << 20)
    assert reads == [[str(corpus[0]), str(held)], [str(held)]]
    reads.clear()
    run([corpus[0]], tmp_path / "kept", chunk_bytes=1 << 20)
    assert reads == [[str(corpus[0])]]  # nothing read twice
    assert snapshot(tmp_path / "kept") == snapshot(baseline[0])
    run([corpus[0]], tmp_path / "reread", heldout_input=[str(held)], chunk_bytes=30000)
    assert snapshot(tmp_path / "reread") == snapshot(tmp_path / "mixed")


def test_duplicates_go_the_same_whatever_the_workers_and_chunks_and_a_rerun_removes_them_again(
    ray_local, corpus, tmp_path, capsys
):
    """Copies near and far (a line repeated at once, the corpus's first 300 lines again at its end),
    removed the same with one worker and one chunk as with two workers and chunks too small to keep
    (read again in the deduplicating and writing passes, the second from the positions kept on
    disk); an interrupted run completed from its plan; dedup=false keeps every copy."""
    _, lines = corpus
    text = lines[:1000] + ["In the beginning"] * 3 + lines[1000:] + lines[:300]
    source = tmp_path / "copies.txt"
    source.write_text("\n".join(text) + "\n", encoding="utf-8")
    one = run([source], tmp_path / "one", workers=1, chunk_bytes=1 << 20, kneser_ney_orders=[2])
    capsys.readouterr()
    many = run([source], tmp_path / "many", workers=2, chunk_bytes=20_000, kneser_ney_orders=[2])
    assert "duplicates removed: train " in capsys.readouterr().out
    assert snapshot(tmp_path / "many") == snapshot(tmp_path / "one")
    drop_files = sorted(p.name for p in (tmp_path / "many" / "duplicates").iterdir())
    assert len(drop_files) >= 3 and all(re.fullmatch(r"chunk-\d{6}\.u32", n) for n in drop_files)
    unique = first_copies(text, heldout_threshold(SETTINGS["heldout_fraction"]))
    removed = many["lines"]["duplicates"]
    for split in fmt.SPLITS:
        seen = [" ".join(s) for b in _all_sentences(tmp_path / "many", many, split) for s in b.sentences]
        assert sorted(seen) == sorted(unique[split])
        assert removed[split]["sentences"] == one["lines"]["duplicates"][split]["sentences"]
    total = removed["train"]["sentences"] + removed["heldout"]["sentences"]
    assert total == len(text) - len(unique["train"]) - len(unique["heldout"]) > 300 + 3
    assert removed["train"]["tokens"] + many["totals"]["train"]["tokens"] == sum(
        len(line.split()) for line in text if not is_heldout(" ".join(line.split()), heldout_threshold(0.05))
    )
    # interrupted in the writing pass: completed from the plan, the duplicates read back
    (tmp_path / "many" / "manifest.json").unlink()
    (tmp_path / "many" / "train-000000.tar").unlink()
    run([source], tmp_path / "many", workers=2, chunk_bytes=20_000, kneser_ney_orders=[2])
    assert snapshot(tmp_path / "many") == snapshot(tmp_path / "one")
    # a damaged record of them is named, not trusted
    for written in [tmp_path / "many" / "manifest.json", *(tmp_path / "many").glob("*.tar")]:
        written.unlink()
    damaged = sorted((tmp_path / "many" / "duplicates").iterdir())[0]
    damaged.write_bytes(damaged.read_bytes()[:-4])
    with pytest.raises(ShardError, match=r"duplicates/chunk-\d+\.u32 holds \d+ bytes, not the \d+ positions"):
        run([source], tmp_path / "many", workers=2, chunk_bytes=20_000, kneser_ney_orders=[2])
    kept = run([source], tmp_path / "kept", dedup=False, kneser_ney_orders=[2])
    assert kept["lines"]["duplicates"]["train"] == {"sentences": 0, "tokens": 0}
    assert kept["totals"]["train"]["sentences"] + kept["totals"]["heldout"]["sentences"] == len(text)
    assert not (tmp_path / "kept" / "duplicates").exists()
    assert "duplicates: kept (dedup=false)" in capsys.readouterr().out


def test_rerun_refuses_an_input_edited_since_complete_or_partial(ray_local, corpus, tmp_path):
    """An edit that keeps the lines and tokens (one word for another) is another corpus: neither
    "already complete" nor a partial output completed from the new text beside the old shards."""
    source = tmp_path / "in.txt"
    lines = corpus[1][:800]
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    run([source], out, chunk_bytes=20000)
    edited = lines[0].split(" ")
    edited[0] = "X" * len(edited[0])
    source.write_text("\n".join([" ".join(edited), *lines[1:]]) + "\n")
    with pytest.raises(
        ShardError, match=r"belongs to a run of other input versions \(.*in.txt changed since"
    ):
        run([source], out, chunk_bytes=20000)
    (out / "manifest.json").unlink()
    (out / "train-000000.tar").unlink()
    with pytest.raises(ShardError, match=r"shard_run.json belongs to a run of other input versions"):
        run([source], out, chunk_bytes=20000)
    assert (out / "vocab.txt").exists() and (out / "shard_plan.json").exists()  # kept, not mixed


def test_bad_input_lines_are_replaced_skipped_and_counted(ray_local, tmp_path):
    good = [f"line number {i} of the corpus" for i in range(40)]
    data = "\n".join(good).encode() + b"\n"
    data += b"\n   \n\t\n"  # 3 empty
    data += b"caf\xe9 au lait\n"  # latin-1: invalid UTF-8, kept with U+FFFD
    data += b"nul\x00glued bell\x07\n"  # control characters: spaces, so three tokens
    data += b"w " * 300 + b"\n"  # 600 bytes: overlong (limit 200)
    data += b"z" * 5000 + b"\n"  # overlong, longer than a read: dropped by the reader
    data += b"final line"
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    manifest = run(
        [path], tmp_path / "out", max_line_bytes=200, chunk_bytes=256, heldout_fraction=0.0, min_count=1
    )
    lines = manifest["lines"]
    assert lines["read"] == 40 + 3 + 1 + 1 + 2 + 1
    assert lines["skipped"] == {"empty": 3, "overlong": 2}
    assert lines["invalid_utf8_replaced"] == 1
    assert lines["control_chars_replaced"] == 1 == manifest["inputs_detail"][0]["control_chars_replaced"]
    assert lines["sentences"] == {"train": 43, "heldout": 0}
    sentences = [
        " ".join(s) for b in _all_sentences(tmp_path / "out", manifest, "train") for s in b.sentences
    ]
    assert "caf\ufffd au lait" in sentences and "final line" in sentences
    assert "nul glued bell" in sentences
    vocab = (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert {"nul", "glued", "bell"} <= set(vocab) and not any("\x00" in t or "\x07" in t for t in vocab)


def test_a_run_that_fails_before_writing_leaves_no_folder_it_created(ray_local, tmp_path, capsys):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    new = tmp_path / "new"
    code, err = _cli(capsys, "--input", str(blank), "--output", str(new / "deeper" / "out"))
    assert code == 2 and err.startswith("error: empty corpus")
    assert not new.exists()  # the probe created new/deeper/out; the failed run took it back
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("the user's")
    with pytest.raises(ShardError, match="empty corpus"):
        run([blank], existing / "out")
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
    with pytest.raises(ShardError, match="holds notes.txt, which elmo shard did not write"):
        run([blank], existing)  # a folder of someone else's files is not written into at all
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ShardError, match="empty corpus"):
        run([blank], empty)
    assert empty.is_dir()


@pytest.mark.parametrize("name", ["vocab_counts.tsv", "shard_plan.json", "notes.txt"])
def test_a_users_files_are_never_written_over(ray_local, corpus, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("the user's")
    with pytest.raises(ShardError, match=rf"holds {name}"):
        run([corpus[0]], out)
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [(name, "the user's")]


def test_a_second_run_into_a_folder_being_written_is_refused(ray_local, corpus, tmp_path):
    from pipeline.output_folder import Lease

    out = tmp_path / "out"
    with Lease(str(out), ShardError, "output"):  # another run, still writing
        with pytest.raises(ShardError, match=rf"output {out} is in use by another run \(host "):
            run([corpus[0]], out)
    assert sorted(p.name for p in out.iterdir()) == []  # nothing of the refused run's


def test_explicit_heldout_input_and_moses(ray_local, tmp_path):
    train = tmp_path / "train.txt"
    train.write_text('He said, "Let there be light."\nAnd there was light.\n')
    held = tmp_path / "held.txt"
    held.write_text("Light, again.\n")
    manifest = run(
        [train], tmp_path / "out", heldout_input=[str(held)], tokenizer="moses", heldout_fraction=0.0
    )
    heldout = _all_sentences(tmp_path / "out", manifest, "heldout")
    assert [s for b in heldout for s in b.sentences] == [["Light", ",", "again", "."]]
    assert manifest["totals"]["train"]["tokens"] == 10 + 5
    assert [d["role"] for d in manifest["inputs_detail"]] == ["train+heldout", "heldout"]


def _cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = shard_main([*argv, "progress=false"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    return code, err


def test_bad_invocations_are_one_line_errors(ray_local, corpus, baseline, tmp_path, capsys):
    code, err = _cli(capsys, "--input", str(tmp_path / "nope.txt"), "--output", str(tmp_path / "o"))
    assert code == 2 and err.startswith("error: input ") and "nope.txt: no such file" in err
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    code, err = _cli(capsys, "--input", str(blank), "--output", str(tmp_path / "o"))
    assert code == 2 and "error: empty corpus" in err and "3 lines read, 3 empty" in err
    occupied = tmp_path / "a-file"
    occupied.write_text("x")
    code, err = _cli(capsys, "--input", str(corpus[0]), "--output", str(occupied))
    assert code == 2 and err.startswith(f"error: output {occupied} is a file, not a folder")
    # another config over a finished output is refused, naming what differs
    same = [f"{k}={v}" for k, v in SETTINGS.items() if k != "progress"]
    code, err = _cli(capsys, "--input", str(corpus[0]), "--output", str(baseline[0]), *same, "seed=7")
    assert code == 2 and "belongs to a run with different seed;" in err
    code, err = _cli(capsys, "--input", str(corpus[0]), "--output", str(tmp_path / "o"), "shard_token=5")
    assert code == 2 and "unknown config key 'shard_token'" in err
    code, err = _cli(
        capsys, "--input", str(corpus[0]), "--output", str(tmp_path / "o"), "heldout_fraction=1.5"
    )
    assert code == 2 and "heldout_fraction" in err


def test_s3_input_and_output_give_the_local_bytes(baseline, corpus, s3_prefix):
    out, local = baseline
    source = storage.join(s3_prefix, "in/kjv-slice.txt.gz")
    storage.upload_file(str(corpus[0]), source)
    target = storage.join(s3_prefix, "shards")
    manifest = run([source], target, workers=2, chunk_bytes=30000)
    assert manifest["shards"] == local["shards"] and manifest["vocab"] == local["vocab"]
    assert read_manifest(target).totals == typed(out, local).totals
    assert storage.read_bytes(storage.join(target, "vocab.txt")) == (out / "vocab.txt").read_bytes()
    first = read_manifest(target).urls("train")[0]
    assert [b.sentences for b in fmt.read_shard(first)] == [
        b.sentences for b in fmt.read_shard(str(out / "train-000000.tar"))
    ]
    # partial S3 output: a shard and the manifest gone; the rerun restores the same bytes
    storage.delete(storage.join(target, "manifest.json"))
    storage.delete(first)
    again = run([source], target, workers=2, chunk_bytes=30000)
    assert again == manifest
    assert storage.read_bytes(first) == (out / "train-000000.tar").read_bytes()


def test_s3_errors_are_one_line(ray_local, corpus, s3_prefix, capsys):
    code, err = _cli(
        capsys, "--input", storage.join(s3_prefix, "missing.txt"), "--output", storage.join(s3_prefix, "o")
    )
    assert code == 2 and err.startswith("error: input ") and "missing.txt" in err
    blank = storage.join(s3_prefix, "blank.txt")
    storage.write_bytes(blank, b"\n\n")
    code, err = _cli(capsys, "--input", blank, "--output", storage.join(s3_prefix, "o"))
    assert code == 2 and err.startswith("error: empty corpus")
    assert storage.list_prefix(storage.join(s3_prefix, "o") + "/") == []
    code, err = _cli(capsys, "--input", str(corpus[0]), "--output", "s3://no-such-bucket-for-shards/out")
    assert (
        code == 2 and err.startswith("error: s3://no-such-bucket-for-shards/out") and "does not exist" in err
    )


def test_a_reserved_word_fails_the_stage_in_one_line_before_any_output(ray_local, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of the corpus\n" for i in range(300)) + "held <S> out\n")
    out = tmp_path / "out"
    assert (
        shard_main(["--input", str(corpus), "--output", str(out), "progress=false", "wandb.mode=disabled"])
        != 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: {corpus}: the line 'held <S> out' holds '<S>', a word the shard stage reserves (it adds "
        "<S> and </S> to every sentence itself, and writes <UNK> for words outside the vocabulary; KenLM "
        "spells them <s>, </s>, <unk>): remove or rewrite them in the corpus and run again"
    )
    assert not any("Traceback" in line or "RayTaskError" in line for line in err)
    assert not out.exists()

import json
import math

import pytest

from pipeline.formats.shard_format import FormatError
from pipeline.formats.shard_manifest import (
    ArpaFile,
    KneserNeyModel,
    ShardManifest,
    parse_manifest,
    read_manifest,
)
from pipeline.runtime import storage


def _manifest() -> dict:
    shard = {"name": "train-000000.tar", "sentences": 2, "tokens": 5, "sha256": "ab" * 32}
    return {
        "shards": {"train": [shard], "heldout": []},
        "totals": {
            "train": {"sentences": 2, "tokens": 5, "unk_tokens": 1},
            "heldout": {"sentences": 0, "tokens": 0, "unk_tokens": 0},
        },
        "vocab": {"file": "vocab.txt", "counts_file": "vocab_counts.tsv", "size": 9, "sha256": "cd" * 32},
    }


def test_fields_are_read_typed_and_paths_joined_to_the_folder(tmp_path):
    record = _manifest()
    record["shards"]["heldout"] = [
        {"name": "heldout-000000.tar", "sentences": 3, "tokens": 9, "sha256": "ef" * 32, "unigram_nll": 12.0}
    ]
    record["totals"]["heldout"] = {"sentences": 3, "tokens": 9, "unk_tokens": 3, "blocks": 1, "bytes": 700}
    manifest = ShardManifest.of(record, str(tmp_path))
    assert manifest.shards["train"][0].sha256 == "ab" * 32 and manifest.shards["train"][0].unigram_nll is None
    assert manifest.totals["heldout"].unk_rate == pytest.approx(1 / 3)
    assert manifest.totals["heldout"].targets == 12 and manifest.totals["heldout"].bytes == 700
    assert manifest.totals["train"].shards == 1 and manifest.totals["train"].blocks is None
    assert manifest.urls("heldout") == [str(tmp_path / "heldout-000000.tar")]
    assert manifest.vocab_path == str(tmp_path / "vocab.txt")
    assert manifest.files() == ["vocab.txt", "vocab_counts.tsv", "train-000000.tar", "heldout-000000.tar"]
    assert manifest.unigram_perplexity == pytest.approx(math.exp(12.0 / 12))
    assert manifest.kneser_ney == () and manifest.lines is None and manifest.settings.dedup is False


def test_the_listing_digest_covers_every_field_of_every_entry():
    first = ShardManifest.of(_manifest(), "a").listing_sha256
    assert ShardManifest.of(_manifest(), "elsewhere").listing_sha256 == first  # copied shards: the same data
    changed = _manifest()
    changed["shards"]["train"][0]["blocks"] = 3  # a field no reader types still counts
    assert ShardManifest.of(changed, "a").listing_sha256 != first


def test_listed_shards_must_be_there_and_hold_what_they_claim(tmp_path):
    manifest = ShardManifest.of(_manifest(), str(tmp_path))
    with pytest.raises(FormatError, match=r"train-000000.tar is listed in manifest.json but missing"):
        manifest.check_listed_shards()
    (tmp_path / "train-000000.tar").write_bytes(b"x" * 20)  # room for 2 sentences of 10 bytes
    manifest.check_listed_shards()
    record = _manifest()
    record["shards"]["train"][0].update(sentences=10**13, tokens=10**13)
    manifest = ShardManifest.of(record, str(tmp_path))
    with pytest.raises(FormatError, match=r"claims 10,000,000,000,000 sentences, more than its 20 bytes"):
        manifest.check_listed_shards()
    manifest.check_listed_shards(splits=["heldout"])


def test_read_manifest_and_urls(tmp_path):
    with pytest.raises(FormatError, match="no manifest.json in .*did not finish"):
        read_manifest(str(tmp_path))
    storage.write_bytes(str(tmp_path / "manifest.json"), json.dumps(_manifest()).encode())
    manifest = read_manifest(str(tmp_path))
    assert manifest.urls("train") == [str(tmp_path / "train-000000.tar")]
    assert manifest.urls("heldout") == []
    with pytest.raises(FormatError, match="unknown split 'test'"):
        manifest.urls("test")


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda m: m.pop("vocab"), "needs 'shards', 'totals' and 'vocab'"),
        (lambda m: m["shards"].pop("heldout"), "shards.heldout must be a list"),
        (lambda m: m["shards"]["train"][0].pop("sha256"), r"shards.train\[0\].sha256"),
        (
            lambda m: m["shards"]["train"][0].update(tokens=True),
            r"shards.train\[0\].tokens missing or not int",
        ),
        (
            lambda m: m["shards"]["train"][0].update(unigram_nll="1"),
            r"unigram_nll missing or not a finite number",
        ),
        (lambda m: m["totals"]["train"].update(tokens="5"), "totals.train"),
        (lambda m: m["totals"]["train"].update(bytes=1.5), "totals.train.blocks/bytes not int"),
        (lambda m: m["totals"]["heldout"].pop("unk_tokens"), "totals.heldout.sentences/tokens/unk_tokens"),
        (
            lambda m: m["totals"]["train"].update(unk_tokens=6),
            r"totals.train.unk_tokens must be in \[0, tokens\]",
        ),
        (lambda m: m["vocab"].pop("size"), "vocab.size"),
        (lambda m: m["vocab"].update(distinct_train_tokens="7"), "vocab.distinct_train_tokens not int"),
        # what a stage would read, never trusted: names outside the folder, a check turned off,
        # counts that cannot be
        (
            lambda m: m["shards"]["train"][0].update(name="../elsewhere/train-000000.tar"),
            "is not a train-NNNNNN.tar file",
        ),
        (
            lambda m: m["shards"]["train"][0].update(name="/etc/train-000000.tar"),
            "is not a train-NNNNNN.tar file",
        ),
        (
            lambda m: m["shards"]["train"][0].update(name="heldout-000000.tar"),
            "is not a train-NNNNNN.tar file",
        ),
        (lambda m: m["shards"]["train"][0].update(sha256=""), r"shards.train\[0\].sha256 is not a sha256"),
        (lambda m: m["shards"]["train"][0].update(sentences=-1), "0 <= sentences <= tokens"),
        (
            lambda m: m["vocab"].update(file="../vocab.txt"),
            "vocab.file '../vocab.txt' is not a file of the directory",
        ),
        (lambda m: m["vocab"].update(sha256="x" * 64), "vocab.sha256 is not a sha256"),
        (lambda m: m.update(config={"dedup": "yes"}), "config.dedup is not bool"),
        (lambda m: m.update(config={"min_count": 2.5}), "config.min_count is not int"),
        (
            lambda m: m.update(lines={"read": "9", "skipped": {}}),
            "lines is not the shard stage's line record",
        ),
        (
            lambda m: m.update(
                baselines={"kneser_ney": [{"order": 3, "perplexity": 5.0, "targets": 9, "arpa": "/etc/x"}]}
            ),
            "at most an ARPA file's name, bytes and sha256",
        ),
    ],
)
def test_invalid_manifest_is_one_line_error(tmp_path, mutate, match):
    manifest = _manifest()
    mutate(manifest)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=match) as err:
        read_manifest(str(tmp_path))
    assert "\n" not in str(err.value)
    with pytest.raises(FormatError, match="not valid JSON"):
        parse_manifest(b"{not json", str(tmp_path))


LINES = {"read": 2, "skipped": {"empty": 0, "overlong": 0}}


def test_what_an_older_shard_stage_did_not_record_is_required_of_this_version():
    heldout = {"name": "heldout-000000.tar", "sentences": 1, "tokens": 3, "sha256": "ef" * 32}
    older = _manifest()
    older["shards"]["heldout"] = [heldout]
    read = ShardManifest.of(older, "d")  # no version: the line record and the unigram's cost may be absent
    assert read.lines is None and read.unigram_perplexity is None
    current = older | {"format_version": 2}
    with pytest.raises(FormatError, match=r"shards.heldout\[0\].unigram_nll missing"):
        ShardManifest.of(current, "d")
    current["shards"] = {"train": older["shards"]["train"], "heldout": [{**heldout, "unigram_nll": 3.0}]}
    with pytest.raises(FormatError, match="lines is not the shard stage's line record"):
        ShardManifest.of(current, "d")
    assert ShardManifest.of(current | {"lines": LINES}, "d").lines.read == 2


def _with_kneser_ney(version: int, models) -> dict:
    return _manifest() | {"format_version": version, "baselines": {"kneser_ney": models}, "lines": LINES}


def test_kneser_ney_models_are_read_as_a_list_from_either_format():
    record = {"order": 3, "perplexity": 47.8, "targets": 100}
    three = KneserNeyModel(3, 47.8, 100)
    assert ShardManifest.of(_with_kneser_ney(1, record), "d").kneser_ney == (three,)
    arpa = {"file": "kneser_ney.arpa.gz", "bytes": 1000, "sha256": "ab" * 32}
    five = {**record, "order": 5, "perplexity": 40.4, "arpa": arpa}
    models = ShardManifest.of(_with_kneser_ney(2, [record, five]), "d").kneser_ney
    assert models == (three, KneserNeyModel(5, 40.4, 100, ArpaFile("kneser_ney.arpa.gz", 1000, "ab" * 32)))
    assert (
        ShardManifest.of(_manifest() | {"format_version": 2, "baselines": {}, "lines": LINES}, "d").kneser_ney
        == ()
    )
    with pytest.raises(FormatError, match="not distinct ascending ones"):
        ShardManifest.of(_with_kneser_ney(2, [five, record]), "d")
    with pytest.raises(FormatError, match="for each model, an order in 2..5"):
        ShardManifest.of(_with_kneser_ney(2, record), "d")


def test_the_line_record_and_the_first_skipped_record_are_read():
    lines = {
        "read": 10,
        "skipped": {"empty": 1, "overlong": 0},
        "duplicates": {"train": {"sentences": 2, "tokens": 7}, "heldout": {"sentences": 0, "tokens": 0}},
        "invalid_utf8_replaced": 1,
        "control_chars_replaced": 0,
        "documents": 4,
        "records_skipped": 2,
    }
    inputs = [{"path": "a.jsonl"}, {"path": "b.jsonl", "records_skipped": 2, "first_skipped_record": 17}]
    got = ShardManifest.of(_manifest() | {"lines": lines, "inputs_detail": inputs}, "d").lines
    assert (got.read, got.documents, got.records_skipped) == (10, 4, 2)
    assert got.duplicates == {"train": (2, 7), "heldout": (0, 0)}
    assert got.first_skipped == ("b.jsonl", 17)


def _totals(train_unk: int, heldout_unk: int) -> ShardManifest:
    record = _manifest()
    record["config"] = {"min_count": 1, "max_size": 0}
    record["totals"] = {
        "train": {"sentences": 10, "tokens": 1000, "unk_tokens": train_unk},
        "heldout": {"sentences": 2, "tokens": 200, "unk_tokens": heldout_unk},
    }
    return ShardManifest.of(record, "d")


def test_a_vocabulary_whose_unk_cannot_be_learned_is_one_warning_naming_the_setting():
    warning = _totals(0, 25).unlearnable_unk()
    assert warning.startswith(
        "warning: the training split has no <UNK> while 25 of 200 held-out tokens (12.5%)"
    )
    assert "min_count=1, max_size=0" in warning and "min_count=3" in warning and "\n" not in warning
    assert _totals(5, 25).unlearnable_unk() is None  # the row is trained
    assert _totals(0, 0).unlearnable_unk() is None  # nothing to score by it

"""Outputs as wandb reference artifacts: names both ends agree on, and digests that change with
the manifest and only with it."""

from __future__ import annotations

import json

from pipeline.formats.shard_manifest import ShardManifest
from pipeline.tracking.artifacts import artifact_name, dataset_artifact, model_artifact

ENTRY = {"sentences": 1, "tokens": 3, "sha256": "ab" * 32}
MANIFEST = {
    "shards": {
        "train": [{"name": "train-000000.tar", **ENTRY}, {"name": "train-000001.tar", **ENTRY}],
        "heldout": [{"name": "heldout-000000.tar", **ENTRY}],
    },
    "totals": {
        "train": {"tokens": 10, "sentences": 2, "unk_tokens": 1},
        "heldout": {"tokens": 3, "sentences": 1, "unk_tokens": 0},
    },
    "vocab": {"file": "vocab.txt", "counts_file": "vocab_counts.tsv", "size": 7, "sha256": "cd" * 32},
}


def _dataset(folder, manifest):
    return dataset_artifact(ShardManifest.of(manifest, str(folder)))


def _shards(folder, manifest) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n")
    for split in ("train", "heldout"):
        for record in manifest["shards"][split]:
            (folder / record["name"]).write_bytes(b"tar")


def test_names_come_from_the_outputs_place():
    assert artifact_name("s3://bucket/runs/demo/shards/") == "runs-demo-shards"
    assert artifact_name("/data/runs/demo/train/export") == "demo-train-export"
    assert artifact_name("s3://b/my run") == "b-my_run"
    assert model_artifact("/r/demo/train/export/options.json", "/r/demo/train/export/weights.hdf5").name == (
        "demo-train-export"
    )


def test_a_dataset_is_its_manifest_and_vocabulary_checked_and_its_shards_listed(tmp_path):
    _shards(tmp_path / "shards", MANIFEST)
    spec = _dataset(tmp_path / "shards", MANIFEST)
    assert spec.type == "dataset" and spec.metadata["vocab_size"] == 7
    assert spec.metadata["train"] == {
        "sentences": 2,
        "tokens": 10,
        "unk_tokens": 1,
        "shards": 2,
        "unk_rate": 0.1,
    }
    built = spec.build()
    entries = {path: entry.ref for path, entry in built.manifest.entries.items()}
    assert sorted(entries) == [
        "heldout-000000.tar",
        "manifest.json",
        "train-000000.tar",
        "train-000001.tar",
        "vocab.txt",
    ]
    assert entries["manifest.json"] == f"file://{tmp_path}/shards/manifest.json"


def test_the_digest_is_the_same_for_the_same_output_and_changes_with_its_manifest(tmp_path):
    _shards(tmp_path / "shards", MANIFEST)
    first = _dataset(tmp_path / "shards", MANIFEST).build().digest
    # the stage that reads the output builds the same artifact: the same version on the dashboard
    assert _dataset(tmp_path / "shards", MANIFEST).build().digest == first
    # a shard's content changes only through the manifest (which holds its sha256): a new version
    (tmp_path / "shards" / "train-000000.tar").write_bytes(b"other bytes, manifest unchanged")
    assert _dataset(tmp_path / "shards", MANIFEST).build().digest == first
    changed = {
        **MANIFEST,
        "totals": {**MANIFEST["totals"], "train": {"tokens": 11, "sentences": 2, "unk_tokens": 0}},
    }
    (tmp_path / "shards" / "manifest.json").write_text(json.dumps(changed))
    assert _dataset(tmp_path / "shards", changed).build().digest != first

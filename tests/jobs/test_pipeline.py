"""`elmo pipeline`: every stage wired to the next, on object storage (the README's S3 variant).

A short run (a slice of the sample corpus, a few dozen training steps) through the real CLI entry
point; the demo itself (`make demo`) runs the full-length version and the training tests check
the perplexity targets. The same run shows that no secret reaches a log, an output or the console.
"""

from __future__ import annotations

import json
import os
import re

import h5py
import pytest

from jobs.cli import main as elmo
from pipeline.end_to_end.job import SAMPLE_CORPUS
from pipeline.runtime import storage
from pipeline.tracking import offline_reader

pytestmark = pytest.mark.subprocess


def test_pipeline_end_to_end_on_s3(
    s3_prefix, s3_server, ray_local, ray_temp_dir, fake_wandb_key, short_pipeline, tmp_path, capsys
):
    corpus = tmp_path / "slice.txt"
    corpus.write_text(short_pipeline.corpus_slice(SAMPLE_CORPUS), encoding="utf-8")
    root = s3_prefix.rstrip("/")
    code = elmo(
        [
            "pipeline",
            "--preset",
            "tiny",
            f"storage={root}",
            "name=e2e",
            f"corpus=[{corpus}]",
            *short_pipeline.overrides,
        ]
    )
    console = capsys.readouterr()
    out = console.out
    assert code == 0, out[-2000:]
    progress = [line for line in console.err.splitlines() if line.startswith(("train step", "eval  step"))]
    assert [line.split(" (")[0] for line in progress] == [
        "train step 4/12",
        "train step 8/12",
        "train step 12/12",
        "eval  step 12/12: held-out perplexity " + progress[-1].split("perplexity ")[1].split(" (")[0],
    ], progress
    assert "held-out perplexity" in out and "unigram baseline" in out
    # the shard stage's Kneser-Ney baselines (the pipeline counts the 3- and 5-gram), through the eval
    # rows to the summary, with each split's <UNK> rate (issue 61)
    assert "Kneser-Ney 3-gram baseline" in out and "Kneser-Ney 5-gram baseline" in out
    assert "Kneser-Ney 3-gram " in progress[-1] and "Kneser-Ney 5-gram " in progress[-1]
    assert re.search(r"<UNK> +\d+\.\d\d% of the training tokens, \d+\.\d\d% of the held-out ones", out), out[
        -3000:
    ]
    # the probe of the trained model beside a random one, its report on the same storage
    assert "part of speech (model)" in out and "part of speech (random control)" in out
    assert out.count("part of speech (model)") == 1  # issue 65, item 20: the table was printed twice
    run = f"{root}/e2e"
    probe = json.loads(storage.read_bytes(f"{run}/probe/probe.json"))
    assert set(probe["probes"]) == set(probe["control"]) == {"pos", "wsd"}
    assert storage.exists(f"{run}/probe/probe.png")
    manifest = json.loads(storage.read_bytes(f"{run}/shards/manifest.json"))
    heldout_sentences = manifest["totals"]["heldout"]["sentences"]
    for name in ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt"):
        assert storage.exists(f"{run}/train/export/{name}"), name
    assert storage.exists(f"{run}/train/perplexity.png") and storage.exists(f"{run}/train/metrics.jsonl")
    embedded = json.loads(storage.read_bytes(f"{run}/embeddings/manifest.json"))
    shards = embedded["shards"]
    assert sum(s["sentences"] for s in shards) == heldout_sentences
    first = tmp_path / "first.hdf5"
    storage.download_file(f"{run}/embeddings/{shards[0]['name']}", str(first))
    with h5py.File(first, "r") as f:
        key = sorted(f.keys(), key=int)[0]
        assert f[key].ndim == 3 and f[key].shape[0] == 3 and f[key].shape[2] == 2 * 64

    # the pipeline on the dashboard: one wandb group, a run per stage, each one's sync command printed
    job_types, made, used = {}, {}, {}
    for folder in ("shards", "train", "embeddings", "probe"):
        files = [p for p in storage.list_prefix(f"{run}/{folder}/wandb/") if p.endswith(".wandb")]
        assert len(files) == 1, (folder, files)
        local = tmp_path / f"{folder}.wandb"
        storage.download_file(files[0], str(local))
        recs = offline_reader.records(local)
        record = offline_reader.run_record(recs)
        assert record["run_group"] == "e2e", folder
        job_types[folder] = record["job_type"]
        for artifact in offline_reader.artifacts(recs):
            if artifact["artifact_type"] == "run_table":  # wandb's own, for the probe's table
                continue
            side = used if artifact.get("use_after_commit") else made
            side.setdefault(folder, []).append(
                (artifact["artifact_type"], artifact["name"], artifact["digest"])
            )
    assert job_types == {"shards": "shard", "train": "train", "embeddings": "embed", "probe": "probe"}
    # the lineage: shards -> train -> model -> embed and probe, each input the very version its stage logged
    ((_, dataset, _),) = made["shards"]
    ((_, model, _),) = made["train"]
    assert [a[0] for a in made["shards"] + made["train"] + made["embeddings"] + made["probe"]] == [
        "dataset",
        "model",
        "embeddings",
        "probe-report",
    ]
    assert dataset.endswith("-e2e-shards") and model == "e2e-train-export"
    assert used["train"] == made["shards"]
    assert sorted(used["embeddings"]) == sorted(made["shards"] + made["train"])
    assert used["probe"] == made["train"]
    assert "wandb (offline, group 'e2e'): upload each run with" in out
    for stage, folder in (
        ("shard", "shards"),
        ("train", "train"),
        ("embed", "embeddings"),
        ("probe", "probe"),
    ):
        assert f"  {stage:<6} aws s3 cp --recursive {run}/{folder}/wandb " in out, stage

    secrets = {"AWS_SECRET_ACCESS_KEY": s3_server.secret_key, "WANDB_API_KEY": fake_wandb_key}
    places = {"console": (console.out + console.err).encode()}
    places |= {path: storage.read_bytes(path) for path in storage.list_prefix(f"{run}/")}
    places |= {path: _read(path) for path in _files_under(ray_temp_dir)}
    assert any("runtime_env_agent" in path for path in places), "Ray's session logs were not searched"
    assert any("/wandb/" in path for path in places), "the run's wandb files were not searched"
    leaks = [
        f"{name} in {where}"
        for where, data in places.items()
        for name, s in secrets.items()
        if s.encode() in data
    ]
    assert not leaks, leaks


def _files_under(root: str) -> list[str]:
    return [os.path.join(d, name) for d, _, names in os.walk(root) for name in names]


def _read(path: str) -> bytes:
    """A file's bytes (b"" for a socket, fifo or a file gone meanwhile)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""

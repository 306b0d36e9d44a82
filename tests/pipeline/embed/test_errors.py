"""Bad input, model and output: ``python -m jobs.embed`` fails fast with one ``error:`` line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from embed_fixtures import OPTIONS, WEIGHTS, shard_of

from jobs.embed import main
from pipeline.embed import inputs, manifest, resume
from pipeline.embed.errors import EmbedError
from pipeline.embed.file_format import chosen_format
from pipeline.output_folder import taken_back_on_failure
from pipeline.runtime import cluster_capacity, storage
from pipeline.tools.local_s3 import free_ports


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("In the beginning\nGod created the heaven\n")
    return str(path)


def _run(capsys, *argv) -> tuple[int, str]:
    code = main([*argv, "progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def _model_args():
    return ["--options", str(OPTIONS), "--weights", str(WEIGHTS)]


def test_model_folder_missing_weights(tmp_path, corpus, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(OPTIONS, folder / "options.json")
    code, line = _run(capsys, "--model", str(folder), "--input", corpus, "--output", str(tmp_path / "out"))
    assert code == 2
    assert (
        line == f"error: model weights file {folder / 'weights.hdf5'} does not exist in model folder {folder}"
    )
    assert not (tmp_path / "out").exists()  # failed before touching the output


def test_broken_options_and_weights(tmp_path, corpus, capsys):
    bad = tmp_path / "options.json"
    bad.write_text("{not json")
    code, line = _run(
        capsys,
        "--options",
        str(bad),
        "--weights",
        str(WEIGHTS),
        "--input",
        corpus,
        "--output",
        str(tmp_path / "o"),
    )
    assert code == 2 and line.startswith(f"error: model options file {bad} is not valid JSON")
    junk = tmp_path / "weights.hdf5"
    junk.write_bytes(b"not hdf5")
    code, line = _run(
        capsys,
        "--options",
        str(OPTIONS),
        "--weights",
        str(junk),
        "--input",
        corpus,
        "--output",
        str(tmp_path / "o"),
    )
    assert code == 2 and line.startswith(f"error: model weights {junk}: cannot load")


def test_missing_input_and_bad_settings(tmp_path, corpus, capsys):
    code, line = _run(
        capsys, *_model_args(), "--input", str(tmp_path / "nope.txt"), "--output", str(tmp_path / "o")
    )
    assert code == 2 and "nope.txt: no such file" in line
    code, line = _run(
        capsys, *_model_args(), "--input", corpus, "--output", str(tmp_path / "o"), "layers=middle"
    )
    assert code == 2 and line == "error: config key 'layers' must be one of all, top, average, got 'middle'"
    stateful_refusals = {
        "lines_per_shard=100": "must be a multiple of stateful_batch_size (64)",
        "precision=bf16": "stateful mode computes in float32 only (precision=bf16",
    }
    for override, message in stateful_refusals.items():
        output = str(tmp_path / "o")
        code, line = _run(
            capsys, *_model_args(), "--input", corpus, "--output", output, "--stateful", override
        )
        assert code == 2 and message in line
    for share in ("0", "1.5"):
        code, line = _run(
            capsys, *_model_args(), "--input", corpus, "--output", str(tmp_path / "o"), f"gpu_share={share}"
        )
        assert code == 2 and line == (
            f"error: config key 'gpu_share' must be in (0, 1] or a whole number, got {float(share)}"
        )


def test_s3_output_missing_bucket_denied_and_unreachable(s3_server, corpus, capsys, monkeypatch):
    code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", "s3://no-such-bucket/out")
    assert code == 2 and line.startswith(
        "error: output is not writable: s3://no-such-bucket/out/_progress/.write-probe: bucket 'no-such-bucket' does not exist"
    )

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    storage.configure()
    try:
        code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", s3_server.url("denied"))
    finally:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
        storage.configure()
    assert (
        code == 2
        and "output is not writable" in line
        and ("credentials rejected" in line or "access denied" in line)
    )

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    storage.configure(endpoint_url=f"http://127.0.0.1:{free_ports(1)[0]}")
    try:
        code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", s3_server.url("unreachable"))
    finally:
        storage.configure()
    assert code == 2 and "output is not writable" in line and "cannot reach S3 endpoint" in line


def test_invalid_utf8_refused_by_a_worker_in_one_line(ray_local, tmp_path, capsys):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nnot \xff fine\n")
    output = tmp_path / "new" / "o"
    code, line = _run(
        capsys, *_model_args(), "--input", str(path), "--output", str(output), "invalid_utf8=error"
    )
    assert (
        code == 2
        and line
        == f"error: {path}: line 1 is not valid UTF-8 (byte 4); fix the input or set invalid_utf8=replace"
    )
    # no shard was committed: the run took back its claim (_progress/run.json) and the folders it made,
    # so the suggested rerun with invalid_utf8=replace is not refused as "a run with other settings"
    assert not (tmp_path / "new").exists()


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


SHARD_MANIFEST = {
    "format_version": 1,
    "shards": {
        "train": [{"name": "train-000000.tar", "sentences": 2, "tokens": 5, "sha256": "0" * 64}],
        "heldout": [],
    },
    "totals": {
        "train": {"sentences": 2, "tokens": 5, "unk_tokens": 0},
        "heldout": {"sentences": 0, "tokens": 0, "unk_tokens": 0},
    },
    "vocab": {"file": "vocab.txt", "counts_file": "vocab_counts.tsv", "size": 8, "sha256": "0" * 64},
}
"""A shard stage manifest.json with the fields of the shard format's contract (``shard_format``)."""


def test_an_output_that_is_not_this_stages_is_refused_and_left_as_it_was(tmp_path, corpus, capsys):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps(SHARD_MANIFEST))
    (shards / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n")
    (shards / "train-000000.tar").write_bytes(b"tar")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("the user's")
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "embeddings-000000.hdf5").write_bytes(b"whose?")
    other_manifest = tmp_path / "other"
    other_manifest.mkdir()
    (other_manifest / "manifest.json").write_text('{"something": "else"}')
    existing = tmp_path / "existing.hdf5"
    existing.write_bytes(b"an unrelated HDF5 file")
    folder_hdf5 = tmp_path / "folder.hdf5"
    folder_hdf5.mkdir()
    before = _tree(tmp_path)
    cases = {
        shards: "is a shard directory (its manifest.json is the shard stage's); write the embeddings to another folder",
        notes: "holds notes.txt, which elmo embed did not write; choose an empty or new output folder",
        stray: "holds embeddings-000000.hdf5 but no _progress/run.json: not an elmo embed output "
        "(or one from before _progress/run.json was written); choose an empty or new output folder",
        other_manifest: "holds a manifest.json that elmo embed did not write; choose an empty or new output folder",
        existing: "already exists; pass --overwrite (overwrite=true) to replace it, or choose another path",
        folder_hdf5: "is a folder, not a file; name a new .hdf5 file, or the folder without the suffix",
    }
    for output, message in cases.items():
        code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", str(output))
        assert (code, line) == (2, f"error: output {output} {message}")
    assert _tree(tmp_path) == before  # nothing written, no folder made
    code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", str(notes), "--overwrite")
    assert code == 2 and line == (
        "error: config key 'overwrite' must be false for a folder output "
        "(only a single .hdf5/.h5 file is ever overwritten), got True"
    )


def test_s3_output_that_is_not_this_stages_is_refused(s3_prefix, corpus, capsys):
    shards = storage.join(s3_prefix, "shards")
    storage.write_bytes(storage.join(shards, "manifest.json"), json.dumps(SHARD_MANIFEST).encode())
    existing = storage.join(s3_prefix, "existing.hdf5")
    storage.write_bytes(existing, b"an unrelated HDF5 file")
    before = storage.list_prefix(s3_prefix + "/")
    code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", shards)
    assert code == 2 and line.startswith(f"error: output {shards} is a shard directory")
    code, line = _run(capsys, *_model_args(), "--input", corpus, "--output", existing)
    assert code == 2 and line.startswith(f"error: output {existing} already exists; pass --overwrite")
    assert storage.list_prefix(s3_prefix + "/") == before
    assert storage.read_bytes(existing) == b"an unrelated HDF5 file"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_failed_run_takes_back_its_claim_and_the_folders_it_made(where, tmp_path, request):
    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3_prefix")
    run = {"layers": "all"}

    def failing_run(output: str, commit: bool = False) -> None:
        with pytest.raises(EmbedError, match="a worker failed"):
            with taken_back_on_failure(output, resume.OWN_FILES, claimed=False) as guard:
                resume.check_writable(output)
                guard.claimed = not resume.claim_output(output, run)
                if commit:
                    resume.commit_shard(
                        output,
                        {"index": 0},
                        shard_of(0, [np.zeros((1, 4), np.float32)]),
                        chosen_format("hdf5", "packed"),
                    )
                raise EmbedError("a worker failed")

    fresh = storage.join(root, "new", "deeper", "out")
    failing_run(fresh)
    assert storage.list_prefix(storage.join(root, "new") + "/") == []
    assert where == "s3" or not os.path.exists(storage.join(root, "new"))
    # an earlier run's claim, and a shard this run committed (with its claim), stay for a rerun
    earlier = storage.join(root, "earlier")
    resume.claim_output(earlier, run)
    failing_run(earlier)
    assert storage.exists(manifest.run_path(earlier))
    committed = storage.join(root, "committed")
    failing_run(committed, commit=True)
    assert storage.exists(manifest.run_path(committed)) and storage.exists(
        chosen_format("hdf5", "packed").path(committed, 0)
    )
    # an empty folder that was there before stays
    if where == "local":
        os.mkdir(tmp_path / "empty")
        failing_run(str(tmp_path / "empty"))
        assert os.listdir(tmp_path / "empty") == []


def test_rerun_with_other_settings_or_changed_input_is_refused(tmp_path):
    out = str(tmp_path / "out")
    first = {"format": manifest.FIRST_SCHEMA, "layers": "all", "dtype": "float32"}
    assert resume.claim_output(out, first) is False
    assert resume.claim_output(out, dict(first)) is True
    with pytest.raises(EmbedError, match=r"holds a run with other settings \(layers: 'all', now 'top'\)"):
        resume.claim_output(out, {**first, "layers": "top"})
    # a claim of the first schema, written before layout, pool, precision and file_format were
    # recorded, holds their defaults; this schema's run resumes it
    now = {"schema": manifest.SCHEMA, "layers": "all", "dtype": "float32", **manifest.RUN_DEFAULTS}
    assert resume.claim_output(out, now) is True
    with pytest.raises(EmbedError, match=r"other settings \(layout: 'allennlp', now 'packed'\)"):
        resume.claim_output(out, {**now, "layout": "packed"})

    path = tmp_path / "in.txt"
    path.write_bytes(b"a\nb\nc\n")
    specs = inputs.plan_shards("text", [str(path)], 2)
    shard = shard_of(0, [np.zeros((1, 4), np.float32)] * 2)
    fmt = chosen_format("hdf5", "allennlp")
    entry = resume.commit_shard(out, {"index": 0, "input_sha256": specs[0].input_sha256}, shard, fmt)
    # a first-schema output's entry gets the counts it lacks as 0 (this schema's entries have them all)
    entry = {**dict.fromkeys(manifest.COUNTED, 0), **entry}
    assert resume.complete_shards(out, specs, verify=True, fmt=fmt) == {0: entry}
    storage.write_bytes(fmt.path(out, 0), b"damaged")
    assert resume.complete_shards(out, specs, verify=True, fmt=fmt) == {}  # damaged: redone
    assert resume.complete_shards(out, specs, verify=False, fmt=fmt) == {0: entry}
    path.write_bytes(b"A\nb\nc\n")
    with pytest.raises(EmbedError, match=r"input lines 0-1 changed since the previous run"):
        resume.complete_shards(out, inputs.plan_shards("text", [str(path)], 2), verify=False, fmt=fmt)
    with pytest.raises(EmbedError, match=r"has shard 0 but the input now makes only 0 shards"):
        resume.complete_shards(out, [], verify=False, fmt=fmt)
    assert json.loads(storage.read_bytes(manifest.entry_path(out, 0)))["sha256"] == entry["sha256"]


def test_pool_larger_than_the_embedded_cluster_is_refused(ray_local, monkeypatch):
    from pipeline.embed.config import EmbedConfig
    from pipeline.embed.runner import check_capacity

    cfg = EmbedConfig(model="m", input=["i"], output="o", cpus_per_worker=1.0)
    check_capacity(cfg, 2, 0.0, embedded=True)  # the session cluster has 2 CPUs
    with pytest.raises(EmbedError, match=r"workers=3 actors need 3 CPUs but the Ray cluster has 2"):
        check_capacity(cfg, 3, 0.0, embedded=True)
    with pytest.raises(
        EmbedError, match=r"need 2 GPUs but the Ray cluster has 0; lower workers or gpu_share"
    ):
        check_capacity(cfg, 2, 1.0, embedded=True)
    # a joined cluster is asked first; this one has no autoscaler, so no node comes
    monkeypatch.setattr(cluster_capacity, "PROBE_S", 2.0)
    with pytest.raises(EmbedError, match=r"need 8 CPUs but the Ray cluster has 2.*no node was on its way"):
        check_capacity(cfg, 8, 0.0, embedded=False)

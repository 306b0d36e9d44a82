"""Bad input, model and output: ``python -m jobs.embed`` fails fast with one ``error:`` line, exit 2."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from embed_fixtures import OPTIONS, WEIGHTS

from jobs.embed import main
from pipeline import storage
from pipeline.embed import inputs, manifest, resume
from pipeline.embed.errors import EmbedError
from pipeline.local_s3 import free_ports


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
    code, line = _run(
        capsys,
        *_model_args(),
        "--input",
        corpus,
        "--output",
        str(tmp_path / "o"),
        "--stateful",
        "lines_per_shard=100",
    )
    assert code == 2 and "must be a multiple of stateful_batch_size (64)" in line
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
    code, line = _run(
        capsys, *_model_args(), "--input", str(path), "--output", str(tmp_path / "o"), "invalid_utf8=error"
    )
    assert (
        code == 2
        and line
        == f"error: {path}: line 1 is not valid UTF-8 (byte 4); fix the input or set invalid_utf8=replace"
    )
    assert not os.path.exists(tmp_path / "o" / "manifest.json")


def test_rerun_with_other_settings_or_changed_input_is_refused(tmp_path):
    out = str(tmp_path / "out")
    run = {"layers": "all", "dtype": "float32"}
    assert resume.claim_output(out, run) is False
    assert resume.claim_output(out, dict(run)) is True
    with pytest.raises(EmbedError, match=r"holds a run with other settings \(layers: 'all', now 'top'\)"):
        resume.claim_output(out, {**run, "layers": "top"})

    path = tmp_path / "in.txt"
    path.write_bytes(b"a\nb\nc\n")
    specs = inputs.plan_shards("text", [str(path)], 2)
    entry = resume.commit_shard(out, {"index": 0, "input_sha256": specs[0].input_sha256}, b"payload")
    assert resume.complete_shards(out, specs, verify=True) == {0: entry}
    storage.write_bytes(manifest.shard_path(out, 0), b"damaged")
    assert resume.complete_shards(out, specs, verify=True) == {}  # damaged: redone
    assert resume.complete_shards(out, specs, verify=False) == {0: entry}
    path.write_bytes(b"A\nb\nc\n")
    with pytest.raises(EmbedError, match=r"input lines 0-1 changed since the previous run"):
        resume.complete_shards(out, inputs.plan_shards("text", [str(path)], 2), verify=False)
    with pytest.raises(EmbedError, match=r"has shard 0 but the input now makes only 0 shards"):
        resume.complete_shards(out, [], verify=False)
    assert json.loads(storage.read_bytes(manifest.entry_path(out, 0)))["sha256"] == entry["sha256"]


def test_pool_larger_than_the_embedded_cluster_is_refused(ray_local, monkeypatch):
    from pipeline.embed.runner import check_capacity

    check_capacity(2, 1.0, 0.0, embedded=True)  # the session cluster has 2 CPUs
    with pytest.raises(EmbedError, match=r"workers=3 actors need 3 CPUs but the local Ray cluster has 2"):
        check_capacity(3, 1.0, 0.0, embedded=True)
    with pytest.raises(EmbedError, match=r"need 2 GPUs but the local Ray cluster has 0"):
        check_capacity(2, 1.0, 1.0, embedded=True)
    check_capacity(8, 1.0, 0.0, embedded=False)  # a joined cluster may autoscale

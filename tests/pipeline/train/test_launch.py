"""End-to-end training on Ray Train: tiny preset, the sample corpus, 2 CPU workers, local and S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from shard_builder import sample_sentences, write_sample_shards

from elmo_model import BiLM, batch_to_ids
from pipeline.config import load_config
from pipeline.runtime import storage
from pipeline.tracking import offline_reader
from pipeline.train import checkpoint as ckpt
from pipeline.train.config import TrainConfig
from pipeline.train.export import SOFTMAX_FILE, VOCAB_FILE, model_from_checkpoint, read_softmax
from pipeline.train.launch import TrainError, final_status, prepare_run, run_training
from pipeline.train.metrics import read_metrics
from pipeline.train.run_dir import EXPORT_DIR, METRICS_FILE, PLOT_FILE
from pipeline.train.trainer import Trainer

pytestmark = pytest.mark.timeout(600)

SENTENCES = 6000
HELDOUT = 300
STEPS = 150


def tiny_run_flags(shards: str, run_dir: str) -> list[str]:
    """``elmo train``'s flags for the tiny preset on ``shards`` into ``run_dir``."""
    return ["--shards", shards, "--output", run_dir, "--preset", "tiny"]


def tiny(shards: str, output: str, *overrides: str):
    return load_config(
        TrainConfig,
        preset="tiny",
        overrides=[f"shards={shards}", f"output={output}", "workers=2", *overrides],
    )


@pytest.fixture(scope="module")
def corpus():
    sentences = sample_sentences(SENTENCES)
    return sentences[:-HELDOUT], sentences[-HELDOUT:]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, corpus):
    out = str(tmp_path_factory.mktemp("shards"))
    write_sample_shards(out, *corpus)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shards, ray_local):
    """The one longer run: STEPS steps, evaluated every 50, checkpoints every 50 (keep 2), probed
    every 75."""
    run_dir = str(tmp_path_factory.mktemp("run") / "kjv")
    cfg = tiny(
        shards,
        run_dir,
        f"max_steps={STEPS}",
        "eval_every=50",
        "checkpoint_every=50",
        "eval_max_batches=60",
        "probe_every=75",
        "wandb.group=kjv-study",
    )
    result = run_training(cfg)
    assert result.stage == "train" and result.output == run_dir and result.complete
    assert result.tokens == STEPS * 32 * 20 * 2  # this run's steps x batch x unroll x workers
    return run_dir, result.details.final


def wandb_records(run_dir: str) -> list[dict]:
    """The records of the run's one offline wandb run file, under RUN/wandb."""
    files = offline_reader.run_files(Path(run_dir, "wandb"))
    assert len(files) == 1, files
    return offline_reader.records(files[0])


def wandb_history(run_dir: str) -> list[dict]:
    """The ``history`` records ({key: value} per logged step) of the offline wandb run."""
    return offline_reader.history(wandb_records(run_dir))


def test_train_perplexity_falls_and_heldout_beats_half_the_unigram(trained):
    run_dir, final = trained
    rows = read_metrics(os.path.join(run_dir, METRICS_FILE))
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(10, STEPS + 1, 10))
    assert train[-1]["train/sampled_perplexity"] < 0.5 * train[0]["train/sampled_perplexity"]
    for r in train:
        assert r["train/tokens_per_s"] > 0 and 0 < r["train/mfu"] < 1.0
        assert r["train/sampled_perplexity"] == pytest.approx(np.exp(r["train/loss"]), rel=1e-6)
        # the rows exchange or, when it would move more (a small vocabulary), the dense all-reduce
        assert 0 < r["train/softmax_exchange_bytes"] <= r["train/softmax_dense_bytes"]
        # what the saves of steps 50 and 100 (after those steps' rows) cost the loop: in the next row
        saved = r["step"] in (60, 110)
        assert (r["checkpoint/save_s"] > 0) == saved and 0 <= r["checkpoint/wait_s"] <= r["checkpoint/save_s"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [50, 100, STEPS]
    assert evals[-1]["eval/perplexity"] < evals[0]["eval/perplexity"]
    assert final["status"] == "done" and final["step"] == STEPS
    assert final["eval/perplexity"] <= 0.5 * final["eval/unigram_perplexity"]
    assert final["eval/perplexity_fwd"] > 1 and final["eval/perplexity_bwd"] > 1
    assert Path(run_dir, PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_layers_are_probed_on_the_dashboard_as_the_run_goes(trained):
    from pipeline.probe.live import SAMPLE

    run_dir, _ = trained
    probes = [r for r in read_metrics(os.path.join(run_dir, METRICS_FILE)) if r["kind"] == "probe"]
    assert [r["step"] for r in probes] == [75, STEPS]
    for row in probes:
        for key in (
            "pos_layer0",
            "pos_layer1",
            "pos_layer2",
            "pos_mix",
            "wsd_layer0",
            "wsd_layer1",
            "wsd_layer2",
        ):
            assert 0 <= row[f"probe/{key}"] <= 1, key
        assert row["probe/seconds"] > 0 and row["probe/wsd_examples"] <= SAMPLE["wsd_examples"] * 2
        assert row["probe/pos_test_tokens"] > 1000
    # the same fixed sample each time: the baselines do not move
    assert probes[0]["probe/pos_baseline"] == probes[1]["probe/pos_baseline"]
    history = wandb_history(run_dir)
    assert {"probe/pos_layer1", "probe/wsd_layer2"} <= {k for row in history for k in row}
    # each probe also as a table (a row per probe, a column per layer) and the probe's chart
    files = offline_reader.run_files(Path(run_dir, "wandb"))[0].parent / "files"
    # (a probe's row comes in after its step: it joins a later step's row, its x-axis its own tokens)
    logged_probes = {row["probe_tokens"]: row for row in history if "probe/table" in row}
    assert sorted(logged_probes) == [p["tokens"] for p in probes]
    for probe in probes:
        logged = logged_probes[probe["tokens"]]
        assert logged["probe/pos_layer1"] == pytest.approx(probe["probe/pos_layer1"], rel=1e-9)
        table = json.loads((files / logged["probe/table"]["path"]).read_text())
        assert table["columns"] == ["probe", "layer 0", "layer 1", "layer 2", "mix", "baseline"]
        assert table["data"] == [
            [
                "part of speech (model)",
                *(probe[f"probe/pos_{k}"] for k in ("layer0", "layer1", "layer2", "mix", "baseline")),
            ],
            [
                "word sense (model)",
                *(probe[f"probe/wsd_{k}"] for k in ("layer0", "layer1", "layer2")),
                None,
                probe["probe/wsd_baseline"],
            ],
        ]
        image = files / logged["probe/plot"]["path"]
        assert (
            logged["probe/plot"]["_type"] == "image-file" and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        )


def test_wandb_offline_run_holds_the_logged_perplexities(trained):
    run_dir, _ = trained
    logged: dict[int, dict] = {}
    for r in read_metrics(os.path.join(run_dir, METRICS_FILE)):
        if r["kind"] in ("train", "eval"):
            logged.setdefault(r["step"], {}).update(r)
    history = wandb_history(run_dir)
    seen = 0
    for row in history:
        step = row["_step"]
        for key in ("train/sampled_perplexity", "eval/perplexity", "eval/unigram_perplexity"):
            if key in row:
                assert row[key] == pytest.approx(logged[step][key], rel=1e-6)
                seen += 1
    assert seen >= STEPS // 10 + 3


def test_the_dashboard_run_joins_its_group_against_tokens_with_the_best_perplexity_as_summary(trained):
    run_dir, _ = trained
    recs = wandb_records(run_dir)
    run = offline_reader.run_record(recs)
    assert run["run_group"] == "kjv-study" and run["job_type"] == "train"
    curves = offline_reader.step_metrics(recs)
    assert {curves[g] for g in ("train/*", "eval/*", "checkpoint/*")} == {"tokens"}
    assert curves["probe/*"] == "probe_tokens"
    tokens_per_step = 32 * 20 * 2  # batch x unroll x workers
    rows = offline_reader.history(recs)
    stepped = [row for row in rows if "tokens" in row]  # all but a probe's row past the last step
    assert len(stepped) >= STEPS // 10 and all(
        row["tokens"] == row["_step"] * tokens_per_step for row in stepped
    )
    evals = [r for r in read_metrics(os.path.join(run_dir, METRICS_FILE)) if r["kind"] == "eval"]
    best = min(evals, key=lambda r: r["eval/perplexity"])
    assert best["tokens"] == best["step"] * tokens_per_step  # metrics.jsonl carries them too
    got = offline_reader.summary(recs)
    assert got["best/perplexity"] == pytest.approx(best["eval/perplexity"], rel=1e-9)
    assert got["best/step"] == best["step"] and got["best/tokens"] == best["tokens"]
    ratio = best["eval/perplexity"] / best["eval/unigram_perplexity"]
    assert got["best/perplexity_to_unigram"] == pytest.approx(ratio, rel=1e-9)
    assert not [k for k in got if k.startswith("best/perplexity_to_kneser_ney")]  # these shards have none


def test_checkpoints_keep_the_last_two_and_the_export_reproduces_the_model(trained, tmp_path):
    run_dir, _ = trained
    assert [step for step, _ in ckpt.list_checkpoints(run_dir)] == [100, STEPS]
    bilm, softmax, payload = model_from_checkpoint(ckpt.latest_checkpoint(run_dir))
    export = os.path.join(run_dir, EXPORT_DIR)
    loaded = BiLM.from_files(os.path.join(export, "options.json"), os.path.join(export, "weights.hdf5"))
    ids = batch_to_ids(
        [["In", "the", "beginning", "God", "created"], ["And", "Moses", "said", "unto", "the", "LORD"]]
    )
    with torch.no_grad():
        expected, got = bilm(ids), loaded(ids)
    torch.testing.assert_close(got.layers, expected.layers, rtol=1e-5, atol=1e-6)
    weight, bias = read_softmax(os.path.join(export, SOFTMAX_FILE))
    np.testing.assert_array_equal(weight, softmax.weight.detach().numpy())
    np.testing.assert_array_equal(bias, softmax.bias.detach().numpy())
    assert Path(export, VOCAB_FILE).read_bytes() == payload["vocab"]
    # elmo export CHECKPOINT OUT writes the same pair
    from jobs.export import main as export_main

    assert export_main([run_dir, str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "weights.hdf5").read_bytes() == Path(export, "weights.hdf5").read_bytes()


def test_export_refuses_a_folder_of_other_files_unless_overwrite(trained, tmp_path, capsys):
    from jobs.export import main as export_main

    run_dir, _ = trained
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "options.json").write_text('{"mine": true}')
    (mine / "notes.txt").write_text("keep me")
    assert export_main([run_dir, str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: output {mine} holds notes.txt, which elmo export did not write; choose an empty or new output "
        "folder, or pass --overwrite to replace its export files and keep the rest"
    )
    assert (mine / "options.json").read_text() == '{"mine": true}' and sorted(os.listdir(mine)) == [
        "notes.txt",
        "options.json",
    ]
    assert export_main([run_dir, str(mine), "--overwrite"]) == 0
    assert (
        json.loads((mine / "options.json").read_text())["lstm"]
        and (mine / "notes.txt").read_text() == "keep me"
    )
    # an earlier export is this command's own (its export.json says so): exported again without --overwrite
    assert export_main([run_dir, str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "export.json").read_text())["checkpoint"].startswith(run_dir)
    assert export_main([run_dir, str(tmp_path / "again")]) == 0
    # released ELMo files (only an export's names, no export.json) are not an export: refused
    released = tmp_path / "released"
    released.mkdir()
    (released / "options.json").write_text('{"released": true}')
    (released / "weights.hdf5").write_bytes(b"released weights")
    assert export_main([run_dir, str(released)]) == 2
    assert "holds options.json but no export.json: not an elmo export output" in capsys.readouterr().err
    assert (released / "weights.hdf5").read_bytes() == b"released weights"


def test_export_reads_its_marker_before_writing_over_an_earlier_export(trained, tmp_path, capsys):
    """``export.json`` names the stage and the run: another run's export, or a marker that is not
    an export's ({}, [], text), is refused in one line and left as it was; --overwrite replaces."""
    from jobs.export import main as export_main

    run_dir, _ = trained
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = {"stage": "export", "run": "/elsewhere/run", "step": 3}
    (theirs / "export.json").write_text(json.dumps(marker))
    (theirs / "options.json").write_text('{"theirs": true}')
    assert export_main([run_dir, str(theirs)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"error: output {theirs} holds the export of /elsewhere/run (export.json), not of {run_dir}"
    )
    assert "\n" not in err and (theirs / "options.json").read_text() == '{"theirs": true}'
    for damaged in ("{}", "[]", "some text", json.dumps({"stage": "probe", "model": {}})):
        (theirs / "export.json").write_text(damaged)
        assert export_main([run_dir, str(theirs)]) == 2
        err = capsys.readouterr().err.strip()
        assert (
            "not an elmo export marker" in err or "names no run or checkpoint" in err
        ) and "\n" not in err, err
        assert (theirs / "options.json").read_text() == '{"theirs": true}'
    assert export_main([run_dir, str(theirs), "--overwrite"]) == 0
    written = json.loads((theirs / "export.json").read_text())
    assert written["stage"] == "export" and written["run"] == run_dir
    assert export_main([run_dir, str(theirs)]) == 0  # now this run's: exported again
    (tmp_path / "a-file").write_text("x")
    assert export_main([run_dir, str(tmp_path / "a-file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_continue_pretraining_from_exported_weights(trained, shards, tmp_path):
    run_dir, _ = trained
    cfg = tiny(
        shards,
        str(tmp_path / "adapt"),
        f"init_from={os.path.join(run_dir, EXPORT_DIR)}",
        "workers=1",
        "wandb.mode=disabled",
    )
    worker = Trainer(cfg, prepare_run(cfg), torch.device("cpu"))
    source, softmax, _ = model_from_checkpoint(ckpt.latest_checkpoint(run_dir))
    for name, tensor in source.state_dict().items():
        torch.testing.assert_close(worker.runner.bilm.state_dict()[name], tensor, msg=name)
    torch.testing.assert_close(worker.runner.softmax.weight.detach(), softmax.weight.detach())
    assert worker.step == 0


def test_rerun_resumes_from_the_latest_checkpoint(shards, tmp_path, ray_local, capsys):
    from jobs.train import main as train_main

    run_dir = str(tmp_path / "resume")
    common = ["checkpoint_every=10", "log_every=5", "eval_max_batches=4", "wandb.mode=disabled"]
    flags = [
        *tiny_run_flags(shards, run_dir),
        "--workers",
        "2",
        "--name",
        "resumable",
    ]
    assert train_main([*flags, "--max-steps", "20", *common]) == 0
    assert capsys.readouterr().out.startswith("trained to step 20: held-out perplexity ")
    assert ckpt.load_model(ckpt.latest_checkpoint(run_dir))["step"] == 20
    assert train_main([*flags, "--max-steps", "30", *common]) == 0
    rows = read_metrics(os.path.join(run_dir, METRICS_FILE))
    events = [r for r in rows if r["kind"] == "event"]
    assert events == [{"kind": "event", "step": 20, "event": "resume", "from_step": 20}]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in rows if r["kind"] == "status"] == [20, 30]
    assert ckpt.load_model(ckpt.latest_checkpoint(run_dir))["step"] == 30
    # run again as it is: it resumes from its final checkpoint, evaluates and exports again, and
    # metrics.jsonl still holds each step of each kind once
    assert train_main([*flags, "--max-steps", "30", *common]) == 0
    rows = read_metrics(os.path.join(run_dir, METRICS_FILE))
    keys = [(r["kind"], r.get("event"), r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), keys
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [20, 30]
    with pytest.raises(TrainError, match="belongs to run 'resumable'"):
        prepare_run(tiny(shards, run_dir, "max_steps=30", "name=other"))


def _train_worker_pids() -> list[int]:
    """Pids of the live Ray Train workers of this session's cluster, from its GCS actor table.

    (``ray.util.state`` needs the dashboard, which the test cluster does not start.)"""
    from ray._private.state import actors

    return [
        a["Pid"]
        for a in actors().values()
        if a["ActorClassName"] == "RayTrainWorker" and a["State"] == "ALIVE" and a["Pid"]
    ]


def test_killed_worker_restarts_from_checkpoint_on_s3(shards, s3_prefix, ray_local, capsys):
    s3_shards = storage.join(s3_prefix, "shards")
    for path in storage.list_prefix(shards + "/"):
        storage.upload_file(path, storage.join(s3_shards, os.path.basename(path)))
    run_dir = storage.join(s3_prefix, "run")
    cfg = tiny(
        s3_shards,
        run_dir,
        "max_steps=40",
        "checkpoint_every=10",
        "log_every=10",
        "eval_max_batches=4",
        "max_failures=2",
    )
    killed: list[int] = []
    at_kill: list[dict] = []
    wandb_at_kill: list[str] = []

    def kill_after_first_checkpoint():
        deadline = time.time() + 300
        while time.time() < deadline and not ckpt.list_checkpoints(run_dir):
            time.sleep(0.5)
        pids = _train_worker_pids()
        if pids:
            os.kill(pids[-1], signal.SIGKILL)
            killed.append(pids[-1])
            # what the crash left on s3: the record up to the checkpoint, wandb's with it
            at_kill.extend(read_metrics(storage.join(run_dir, METRICS_FILE)))
            wandb_at_kill.extend(storage.list_prefix(storage.join(run_dir, "wandb") + "/"))

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    result = run_training(cfg)
    final = result.details.final
    killer.join(timeout=5)
    assert killed, "no Ray Train worker was found to kill"
    # a crash loses at most one interval on s3: the rows and the wandb history of the checkpoint's step
    # were there when the worker died
    checkpointed = [r["step"] for r in at_kill if r["kind"] == "train"]
    assert checkpointed and checkpointed[0] == 10, at_kill
    assert any("/wandb/attempt-001/" in path for path in wandb_at_kill), wandb_at_kill
    assert "restarting from the latest checkpoint (1 of max_failures=2)" in capsys.readouterr().err
    assert final["status"] == "done" and final["step"] == 40
    rows = read_metrics(storage.join(run_dir, METRICS_FILE))
    resumes = [r for r in rows if r.get("event") == "resume"]
    assert resumes and resumes[0]["from_step"] >= 10
    assert [r["step"] for r in rows if r["kind"] == "train"] == [10, 20, 30, 40]
    assert [step for step, _ in ckpt.list_checkpoints(run_dir)] == [30, 40]
    assert storage.exists(storage.join(run_dir, EXPORT_DIR, "weights.hdf5"))
    # one wandb run across the restart: both attempts' offline directories carry the run's id,
    # and the sync command names them all
    wandb_id = json.loads(storage.read_bytes(storage.join(run_dir, "run.json")))["wandb_id"]
    attempts = {
        "/".join(path.split("/wandb/", 1)[1].split("/")[:3])
        for path in storage.list_prefix(storage.join(run_dir, "wandb") + "/")
    }
    assert len(attempts) == 2 and all(a.endswith(f"-{wandb_id}") for a in attempts), attempts
    assert sorted(a.split("/")[0] for a in attempts) == ["attempt-001", "attempt-002"]
    assert result.wandb_sync.endswith(f"./wandb-{wandb_id}/attempt-*/wandb/offline-run-*-{wandb_id}")
    # the offline wandb run of an s3 run directory is written locally, then uploaded at the end
    # (wandb runs in the workers only: it is never started in this test process)
    runs = [p for p in storage.list_prefix(storage.join(run_dir, "wandb") + "/") if p.endswith(".wandb")]
    assert any(b"train/sampled_perplexity" in storage.read_bytes(p) for p in runs)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(shards, tmp_path):
    # in-process, one rank: the loop and the driver's final check without a Ray cluster
    run_dir = str(tmp_path / "nan")
    cfg = tiny(
        shards,
        run_dir,
        "workers=1",
        "max_steps=6",
        "checkpoint_every=1",
        "optimizer.name=adagrad",
        "optimizer.lr=1e30",
        "guard.enabled=false",  # the guard would see the blow-up first; this test is about the NaN check
        "eval_max_batches=2",
        "wandb.mode=disabled",
    )
    status = Trainer(cfg, prepare_run(cfg), torch.device("cpu")).run()
    assert status["status"] == "nan"
    with pytest.raises(TrainError, match="non-finite loss") as err:
        final_status(status)
    assert "\n" not in str(err.value)
    good = ckpt.list_checkpoints(run_dir)
    assert good and good[-1][0] < 6 and str(good[-1][1]) in str(err.value)
    assert not storage.exists(os.path.join(run_dir, EXPORT_DIR, "weights.hdf5"))


def test_sigterm_stops_the_run_after_a_step_with_its_checkpoint_and_exits_143(shards, tmp_path, ray_local):
    """SIGTERM (a scheduler stopping the job) to `elmo train` (here joining the session's cluster
    through RAY_ADDRESS) after its first checkpoint: the run stops after a step, writes that step's
    checkpoint and says so, exit status 143, no crash report, and that checkpoint loads. On an
    embedded cluster, to the group and at start-up: test_stopping.py."""
    run_dir = str(tmp_path / "run")
    command = [sys.executable, "-m", "jobs.train", *tiny_run_flags(shards, run_dir)]
    settings = ["workers=1", "max_steps=100000", "checkpoint_every=5", "log_every=5", "wandb.mode=disabled"]
    proc = subprocess.Popen([*command, *settings], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not ckpt.list_checkpoints(run_dir):
            time.sleep(0.5)
        assert proc.poll() is None and ckpt.list_checkpoints(run_dir), "no checkpoint before the deadline"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-2000:]
    latest = ckpt.latest_checkpoint(run_dir)
    step = ckpt.load_model(latest)["step"]
    assert err.strip().splitlines()[-1] == (
        f"terminated: stopped at step {step}; checkpoint {latest}; rerun the same command to continue"
    ), err[-2000:]
    assert "SIGTERM received" not in err and "Traceback" not in err


def test_an_embedded_cluster_beside_another_ray_trains_without_a_lookup_traceback(
    shards, tmp_path, ray_local
):
    """`elmo train` with no RAY_ADDRESS starts its own cluster while another Ray runs on the machine
    (here the session's): Ray Train's placement-group cleaner finds its own cluster's State API,
    where it used to look for "the" Ray and print a traceback ("Found multiple active Ray
    instances") every run."""
    run_dir = str(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    settings = ["workers=1", "max_steps=30", "log_every=10", "wandb.mode=disabled"]
    result = subprocess.run(
        [sys.executable, "-m", "jobs.train", *tiny_run_flags(shards, run_dir), *settings],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "embedded cluster" in result.stderr  # its own, not the session's
    assert "multiple active Ray" not in result.stderr and "Traceback" not in result.stderr, result.stderr[
        -3000:
    ]


def test_a_run_records_its_config_without_the_credentials_of_its_endpoint(shards, tmp_path, single_thread):
    secret = "topsecret-9c1b"
    endpoint = f"http://AKIAUSER:{secret}@127.0.0.1:9"  # local paths: configured, never dialled
    run_dir = tmp_path / "run"
    overrides = ["workers=1", "max_steps=4", "log_every=2", "checkpoint_every=4", "eval_max_batches=1"]
    cfg = tiny(shards, str(run_dir), *overrides, "wandb.mode=offline", f"storage_endpoint={endpoint}")
    try:
        status = Trainer(cfg, prepare_run(cfg), torch.device("cpu")).run()
    finally:
        storage.configure()
    assert status["status"] == "done"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any("checkpoints" in p.parts for p in files)
    assert [str(p) for p in files if secret.encode() in p.read_bytes()] == []
    [config] = [r for r in read_metrics(str(run_dir / METRICS_FILE)) if r["kind"] == "config"]
    assert config["config"]["storage_endpoint"] == "http://***@127.0.0.1:9"


def test_a_full_disk_during_a_checkpoint_is_named_and_not_retried(shards, small_filesystem, ray_local):
    run_dir = str(small_filesystem / "run")  # 2 MiB: the run's records fit, a checkpoint (~5 MB) does not
    cfg = tiny(shards, run_dir, "workers=1", "max_steps=4", "checkpoint_every=2", "wandb.mode=disabled")
    with pytest.raises(TrainError) as err:
        run_training(cfg)
    message = str(err.value)
    assert "no space left on the filesystem mounted at" in message and str(small_filesystem) in message
    assert message.endswith("(not retried: it would fail again)") and "\n" not in message


def test_evaluations_during_the_run_score_a_fixed_sample_and_the_last_one_all(
    shards, tmp_path, single_thread
):
    run_dir = tmp_path / "run"
    overrides = ["workers=1", "max_steps=4", "eval_every=2", "log_every=2", "checkpoint_every=4"]
    cfg = tiny(
        shards,
        str(run_dir),
        *overrides,
        "eval_batch_size=16",
        "eval_interval_batches=2",
        "wandb.mode=disabled",
    )
    assert Trainer(cfg, prepare_run(cfg), torch.device("cpu")).run()["status"] == "done"
    evals = [r for r in read_metrics(str(run_dir / METRICS_FILE)) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert evals[0]["eval/batches"] == 2  # the first two batches of the split, whatever its size
    assert evals[1]["eval/batches"] > 10  # the end of the run: all of HELDOUT=300 sentences
    assert all(r["eval/seconds"] > 0 for r in evals)


def test_no_placement_group_cleaner_where_no_state_api_answers(monkeypatch):
    """Ray Train's placement-group cleaner asks the State API (the dashboard's) every second; on a
    cluster without a dashboard each ask warned (253 lines in a five-minute H200 run), so a run
    there goes without it, and keeps it where the dashboard runs."""
    from pipeline.runtime import ray_runtime
    from pipeline.train.fit import _stoppable_trainer, graceful_stop

    trainer = _stoppable_trainer(graceful_stop(None))(lambda _: None, train_loop_config={})
    names = lambda: [type(c).__name__ for c in trainer._create_default_callbacks()]  # noqa: E731
    monkeypatch.setattr(ray_runtime, "state_api_available", lambda: True)
    assert "PlacementGroupCleanerCallback" in names()
    monkeypatch.setattr(ray_runtime, "state_api_available", lambda: False)
    got = names()
    assert "PlacementGroupCleanerCallback" not in got and "BackendSetupCallback" in got


def test_an_aborted_stop_says_what_it_kept_and_that_no_export_was_written(tmp_path):
    """Issue 65, item 12: a stop whose grace period ran out in the final evaluation printed a bare
    ``terminated``: it now names why it was aborted, the checkpoint kept and the missing export."""
    from pipeline.train.fit import GRACE_S, aborted, graceful_stop

    run = str(tmp_path / "run")
    graceful = graceful_stop(None)
    assert aborted(graceful, run) == (
        "aborted (a second signal); no checkpoint, the run is not exported; rerun the same command to continue"
    )
    ckpt.mark_complete(ckpt.checkpoint_path(run, 40), 40, 1)
    graceful.grace_over = True
    assert aborted(graceful, run) == (
        f"aborted (no step boundary within the {GRACE_S:.0f} s grace period: a long step, or the final "
        f"evaluation and export); the latest checkpoint {ckpt.checkpoint_path(run, 40)} is kept, the run is "
        "not exported; rerun the same command to continue"
    )

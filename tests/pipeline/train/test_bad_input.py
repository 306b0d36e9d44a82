"""Bad training input fails up front with one clear line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from shard_builder import sample_sentences, write_sample_shards

from jobs.train import main as train_main
from pipeline.config import ConfigError, load_config
from pipeline.formats import shard_format
from pipeline.formats.shard_format import FormatError
from pipeline.formats.shard_manifest import read_manifest
from pipeline.formats.unigram import heldout_unigram_perplexity
from pipeline.runtime import cluster_capacity, storage
from pipeline.train.config import TrainConfig
from pipeline.train.launch import TrainError, _cluster_check, _model_options, gpus_possible, prepare_run


@pytest.fixture
def shards(tmp_path):
    sentences = sample_sentences(400)
    out = str(tmp_path / "shards")
    write_sample_shards(out, sentences[:-100], sentences[-100:])
    return out


def cfg_for(shards: str, output: str, *overrides: str):
    return load_config(
        TrainConfig,
        preset="tiny",
        overrides=[f"shards={shards}", f"output={output}", "max_steps=5", *overrides],
    )


def test_missing_shard_directory(tmp_path):
    with pytest.raises(FormatError, match="no manifest.json in .*nowhere"):
        prepare_run(cfg_for(str(tmp_path / "nowhere"), str(tmp_path / "run")))


def test_missing_shard(shards, tmp_path):
    os.remove(os.path.join(shards, "train-000001.tar"))
    with pytest.raises(FormatError, match="train-000001.tar is listed in manifest.json but missing"):
        prepare_run(cfg_for(shards, str(tmp_path / "run")))


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_a_launch_reads_no_shard_bytes_on_the_driver(shards, tmp_path):
    junk = os.urandom(1 << 20) * 16  # 16 MiB where each shard was: not even a tar
    manifest = json.loads(storage.read_bytes(os.path.join(shards, "manifest.json")))
    listed = manifest["shards"]
    expected = heldout_unigram_perplexity(
        read_manifest(shards)
    )  # recorded in the manifest by the shard writer
    # the shard stage's Kneser-Ney record, as it writes it
    manifest["baselines"] = {
        "kneser_ney": [
            {"order": 3, "perplexity": 150.5, "nll": 1.0, "targets": 2},
            {"order": 4, "perplexity": 123.4, "nll": 1.0, "targets": 2},
        ]
    }
    storage.write_bytes(os.path.join(shards, "manifest.json"), json.dumps(manifest).encode())
    for entry in listed["train"] + listed["heldout"]:
        storage.write_bytes(os.path.join(shards, entry["name"]), junk)
    before = _bytes_read()
    plan = prepare_run(cfg_for(shards, str(tmp_path / "run"), "softmax.negatives=100"))
    assert _bytes_read() - before < len(junk)  # the manifest and the vocabulary only
    totals = manifest["totals"]
    assert plan.baselines == {
        "eval/unigram_perplexity": expected,
        "eval/kneser_ney_3gram_perplexity": 150.5,
        "eval/kneser_ney_4gram_perplexity": 123.4,
        "eval/train_unk_rate": totals["train"]["unk_tokens"] / totals["train"]["tokens"],
        "eval/heldout_unk_rate": totals["heldout"]["unk_tokens"] / totals["heldout"]["tokens"],
    }


@pytest.mark.parametrize(
    "record",
    [
        [{"order": 7, "perplexity": 90.0, "targets": 5}],
        [{"order": 3, "perplexity": "nan", "targets": 5}],
        [3],
        {"order": 3, "perplexity": 90.0, "targets": 5},  # format 1's one record in a manifest of format 2
    ],
)
def test_a_malformed_kneser_ney_record_is_one_line(shards, tmp_path, record):
    path = os.path.join(shards, "manifest.json")
    manifest = json.loads(storage.read_bytes(path))
    storage.write_bytes(path, json.dumps({**manifest, "baselines": {"kneser_ney": record}}).encode())
    with pytest.raises(
        FormatError,
        match=r"manifest .*manifest.json: baselines.kneser_ney needs, for each model, an order in 2..5",
    ):
        prepare_run(cfg_for(shards, str(tmp_path / "run"), "softmax.negatives=100"))
    assert not (tmp_path / "run").exists()  # refused before the run claims a folder


def test_a_damaged_shard_fails_the_run_in_the_worker_that_reads_it(shards, tmp_path):
    import torch

    from pipeline.train.trainer import Trainer

    first = storage.read_bytes(os.path.join(shards, "train-000000.tar"))
    storage.write_bytes(os.path.join(shards, "train-000001.tar"), first)
    cfg = cfg_for(
        shards,
        str(tmp_path / "run"),
        "softmax.negatives=100",
        "workers=1",
        "max_steps=400",
        "wandb.mode=disabled",
    )
    with pytest.raises(FormatError) as err:
        Trainer(cfg, prepare_run(cfg), torch.device("cpu")).run()
    assert str(err.value).startswith(
        f"shard {os.path.join(shards, 'train-000001.tar')} is damaged or was replaced"
    )


def test_empty_split(shards, tmp_path):
    path = os.path.join(shards, "manifest.json")
    manifest = json.loads(storage.read_bytes(path))
    manifest["shards"]["heldout"] = []
    storage.write_bytes(path, json.dumps(manifest).encode())
    with pytest.raises(
        TrainError,
        match=r"lists no heldout data; it was sharded with heldout_fraction=\S+ and no heldout_input; shard the corpus into a new output with heldout_fraction=0.01 or a heldout_input$",
    ):
        prepare_run(cfg_for(shards, str(tmp_path / "run")))


def test_heldout_split_too_small_for_the_workers(tmp_path):
    """33 held-out sentences over 2 workers: 17 and 16, too few for 32 rows of one evaluation
    batch on either, although the split has far more tokens than 2 x 32."""
    sentences = sample_sentences(400)
    out = str(tmp_path / "shards")
    write_sample_shards(out, sentences[:300], sentences[300:333])
    with pytest.raises(
        TrainError,
        match=r"held-out split \(33 sentences\) gives worker 1 of 2 only 16 sentences, .*eval_batch_size=32 .*"
        r"lower eval_batch_size to 16 or use fewer workers",
    ):
        prepare_run(cfg_for(out, str(tmp_path / "run"), "workers=2"))
    prepare_run(
        cfg_for(out, str(tmp_path / "run"), "workers=2", "eval_batch_size=16", "softmax.negatives=100")
    )


def test_vocab_without_specials(shards, tmp_path):
    path = os.path.join(shards, shard_format.VOCAB_FILE)
    tokens = storage.read_bytes(path).decode().split("\n")
    data = "\n".join(t for t in tokens if t != "<UNK>").encode()
    storage.write_bytes(path, data)
    manifest_file = os.path.join(shards, "manifest.json")
    manifest = json.loads(storage.read_bytes(manifest_file))
    manifest["vocab"]["sha256"] = hashlib.sha256(data).hexdigest()  # a manifest that agrees with it
    storage.write_bytes(manifest_file, json.dumps(manifest).encode())
    with pytest.raises(FormatError, match="must start with <S>, </S>, <UNK>"):
        prepare_run(cfg_for(shards, str(tmp_path / "run")))


def test_too_many_negatives(shards, tmp_path):
    with pytest.raises(TrainError, match="softmax.negatives"):
        prepare_run(cfg_for(shards, str(tmp_path / "run"), "softmax.negatives=100000"))


def test_more_workers_than_the_cluster_has(shards, tmp_path, ray_local, monkeypatch):
    cfg = cfg_for(shards, str(tmp_path / "run"), "workers=3", SMALL)
    message = "workers=3 x threads_per_worker=1 need 3 CPUs but the Ray cluster has 2"

    def asked(bundles):
        raise AssertionError(f"an embedded cluster was asked to grow by {bundles}")

    with monkeypatch.context() as patched:
        patched.setattr(cluster_capacity, "_request", asked)
        with pytest.raises(TrainError, match=message + "; lower workers or threads_per_worker$"):
            _cluster_check(cfg, embedded=True)  # an embedded cluster never grows: refused without asking
    # a joined cluster might autoscale: it is asked, and refused once no node is on its way
    monkeypatch.setattr(cluster_capacity, "PROBE_S", 3.0)
    with pytest.raises(TrainError, match=message + r".*no node was on its way 3 s after asking"):
        _cluster_check(cfg, embedded=False)
    # the whole run: claimed by prepare_run, refused by the cluster, and its claim taken back, so a
    # rerun with other settings (another name, say) is not refused as another run's
    from pipeline.train.launch import run_training

    with pytest.raises(TrainError, match=message):
        run_training(cfg, prepare_run(cfg))
    assert os.listdir(tmp_path / "run") == []


def test_cli_reports_one_line(shards, tmp_path, capsys):
    code = train_main(
        ["--shards", str(tmp_path / "missing"), "--output", str(tmp_path / "run"), "--preset", "tiny"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: no manifest.json in") and err.count("\n") == 1


def test_manifest_counts_that_disagree_with_a_shard_fail_the_run_with_one_line(
    shards, tmp_path, ray_local, capsys
):
    """A deterministic error is not retried, however many restarts max_failures allows."""
    from pipeline.train.launch import run_training

    path = os.path.join(shards, "manifest.json")
    manifest = json.loads(storage.read_bytes(path))
    manifest["shards"]["train"][0]["sentences"] += 1  # the bytes (sha256) still match: only reading finds it
    storage.write_bytes(path, json.dumps(manifest).encode())
    cfg = cfg_for(
        shards,
        str(tmp_path / "run"),
        "workers=2",
        "max_failures=2",
        "wandb.mode=disabled",
        "softmax.negatives=100",
    )
    with pytest.raises(
        TrainError,
        match=r"training failed: .*train-000000.tar: manifest lists \d+ sentences.* \(not retried: it would fail again\)",
    ) as err:
        run_training(cfg)
    assert "\n" not in str(err.value)
    assert "restarting" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.name=sgd", "'optimizer.name' must be one of adagrad, adam, adamw, got 'sgd'"),
        ("optimizer.schedule=step", "'optimizer.schedule' must be one of constant, linear, cosine"),
        ("wandb.mode=cloud", "'wandb.mode' must be one of offline, online, disabled"),
        ("use_gpu=maybe", "'use_gpu' must be one of auto, true, false"),
        ("batch_size=0", "'batch_size' must be >= 1"),
        ("max_steps=-1", "'max_steps' must be in \\[0, 2\\*\\*63 - 1\\]"),
        ("dropout=1.5", "'dropout' must be in \\[0, 1\\)"),
    ],
)
def test_bad_settings_are_refused_when_the_config_loads(shards, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message) as err:
        cfg_for(shards, str(tmp_path / "run"), override)
    assert str(err.value).startswith("config key ") and "\n" not in str(err.value)


SMALL = "softmax.negatives=64"
"""The corpus slices' vocabularies are smaller than the tiny preset's negatives."""


@pytest.fixture
def other_shards(tmp_path):
    """Shards of another slice of the corpus: another vocabulary, of another size."""
    sentences = sample_sentences(900)[400:]
    out = str(tmp_path / "other")
    write_sample_shards(out, sentences[:-100], sentences[-100:])
    return out


def _same_size_vocabulary(shards: str, like: str) -> None:
    """Rewrite ``shards``' vocabulary to the size of ``like``'s (different words, as with max_size)."""
    size = read_manifest(like).vocab.size
    vocab_file = os.path.join(shards, "vocab.txt")
    words = storage.read_bytes(vocab_file).decode().splitlines()
    words = (words + [f"extra{i}" for i in range(size)])[:size]
    data = ("\n".join(words) + "\n").encode()
    storage.write_bytes(vocab_file, data)
    path = os.path.join(shards, "manifest.json")
    mine = json.loads(storage.read_bytes(path))
    mine["vocab"].update(size=size, sha256=hashlib.sha256(data).hexdigest())
    storage.write_bytes(path, json.dumps(mine).encode())


@pytest.mark.parametrize("size", ["same size", "another size"])
def test_a_resume_on_another_vocabulary_is_refused_before_ray_starts(shards, other_shards, tmp_path, size):
    if size == "same size":
        _same_size_vocabulary(other_shards, shards)
    run = str(tmp_path / "run")
    prepare_run(cfg_for(shards, run, SMALL))  # claims the run for the first shards
    with pytest.raises(TrainError) as err:
        prepare_run(cfg_for(other_shards, run, "max_steps=20", SMALL))
    message = str(err.value)
    assert "\n" not in message
    assert (
        f"was trained on {shards} (vocabulary" in message and f"not on {other_shards} (vocabulary" in message
    )
    assert "a resume on another vocabulary is refused" in message and "init_from=" in message
    # the claim still names the first data, and the first shards still resume
    assert json.loads(storage.read_bytes(os.path.join(run, "run.json")))["data"]["shards"] == shards
    prepare_run(cfg_for(shards, run, "max_steps=20", SMALL))


def test_a_resume_on_other_shards_with_the_same_vocabulary_is_refused(shards, tmp_path):
    run = str(tmp_path / "run")
    prepare_run(cfg_for(shards, run, SMALL))
    path = os.path.join(shards, "manifest.json")
    manifest = json.loads(storage.read_bytes(path))
    dropped = manifest["shards"]["train"].pop()
    manifest["totals"]["train"]["tokens"] -= dropped["tokens"]
    manifest["totals"]["train"]["sentences"] -= dropped["sentences"]
    storage.write_bytes(path, json.dumps(manifest).encode())
    with pytest.raises(TrainError, match="a resume on another shard set is refused"):
        prepare_run(cfg_for(shards, run, SMALL))


def test_a_vocabulary_its_manifest_does_not_record_is_refused_fresh_and_on_resume(shards, tmp_path):
    """The same words in another order, the same size: the manifest's sha256 tells them apart."""
    run = str(tmp_path / "run")
    prepare_run(cfg_for(shards, run, SMALL))
    path = os.path.join(shards, "vocab.txt")
    words = storage.read_bytes(path).decode().splitlines()
    storage.write_bytes(path, ("\n".join(words[:3] + words[3:][::-1]) + "\n").encode())
    for output in (run, str(tmp_path / "fresh")):
        with pytest.raises(FormatError, match=r"vocab.txt is not the one its manifest.json records"):
            prepare_run(cfg_for(shards, output, SMALL))
    assert not os.path.exists(tmp_path / "fresh")


@pytest.mark.parametrize(
    "files",
    [
        {"perplexity.png": b"my plot"},
        {"export/options.json": b"{}"},
        {"metrics.jsonl": b"my notes\n"},
        {"notes.txt": b"x"},
    ],
    ids=["plot", "export", "metrics", "other"],
)
def test_a_folder_of_someone_elses_files_is_refused_before_anything_is_written(shards, tmp_path, files):
    run = tmp_path / "mine"
    for name, data in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)
    (name,) = files
    with pytest.raises(TrainError, match=rf"output {run} holds {name}") as err:
        prepare_run(cfg_for(shards, str(run), SMALL))
    assert "elmo train" in str(err.value) and "\n" not in str(err.value)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()) == [name]


@pytest.mark.parametrize("override", ["batch_size=100000000", "unroll_steps=100000000"])
def test_a_step_no_machine_holds_is_refused_before_ray_starts(shards, tmp_path, override):
    with pytest.raises(
        TrainError, match=r"positions a step need at least [\d,]+ GiB .*lower batch_size or unroll_steps"
    ):
        prepare_run(cfg_for(shards, str(tmp_path / "run"), override, "use_gpu=false", SMALL))
    assert not (tmp_path / "run").exists()


def test_with_use_gpu_auto_a_step_is_sized_for_the_device_it_will_run_on(shards, tmp_path, monkeypatch):
    """``auto`` without a GPU here, and no cluster to join, trains on this machine's CPUs: a step
    over its memory is refused before Ray starts (it was sized as for a 256 GiB GPU). Joining a
    cluster, whose devices are known only once joined, the GPU bound holds until then."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    lstm = _model_options(cfg_for(shards, str(tmp_path / "run"), SMALL))["lstm"]
    per_position = lstm["n_layers"] * 2 * 4 * lstm["dim"] * 2  # the gates a step keeps, bf16
    # one worker, over this machine's memory and under 256 GiB: held only by a (large) GPU
    unroll = int(min(1.5 * host, 200 * 2**30) / (per_position * 20)) + 1
    cfg = cfg_for(
        shards, str(tmp_path / "run"), f"unroll_steps={unroll}", "batch_size=20", "workers=1", SMALL
    )
    assert not gpus_possible(cfg)
    with pytest.raises(
        TrainError, match=r"positions a step need at least [\d,]+ GiB .*the most a worker here can have is"
    ):
        prepare_run(cfg)
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert gpus_possible(cfg)
    prepare_run(cfg)  # not refused for its size before the cluster's devices are known


def test_an_allocation_that_failed_is_not_retried():
    import torch

    from pipeline.runtime import storage
    from pipeline.train.fit import _worth_retrying

    class Failed(Exception):
        def __init__(self, *failures):
            self.worker_failures = dict(enumerate(failures))

    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried 400 GB"
    )
    for failure in (MemoryError(), cpu, torch.OutOfMemoryError("CUDA out of memory")):
        assert not _worth_retrying(Failed(failure, ConnectionError("lost"))), failure
    assert _worth_retrying(Failed(ConnectionError("lost"), storage.StorageError("s3: timed out")))


def test_a_damaged_run_json_is_named_in_one_line(shards, tmp_path):
    run = tmp_path / "run"
    prepare_run(cfg_for(shards, str(run), SMALL))
    claim = (run / "run.json").read_bytes()
    (run / "run.json").write_bytes(claim[: len(claim) // 2])  # cut short
    with pytest.raises(
        TrainError, match=r"run.json is not an elmo train marker \(a JSON object naming the run"
    ) as err:
        prepare_run(cfg_for(shards, str(run), SMALL))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", [None, 3, ""])
def test_a_run_json_that_names_no_run_is_damaged_not_name_none(shards, tmp_path, name):
    run = tmp_path / "run"
    prepare_run(cfg_for(shards, str(run), SMALL))
    claim = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**claim, "name": name}))
    with pytest.raises(TrainError, match=rf"run.json names no run \({name!r}\): it is damaged") as err:
        prepare_run(cfg_for(shards, str(run), SMALL))
    assert "name=None" not in str(err.value)


def test_the_same_shards_copied_elsewhere_resume(shards, tmp_path):
    run = str(tmp_path / "run")
    prepare_run(cfg_for(shards, run, SMALL))
    copy = str(tmp_path / "copy")
    shutil.copytree(shards, copy)
    plan = prepare_run(cfg_for(copy, run, SMALL))
    assert plan.manifest.folder == copy


def test_a_second_run_into_the_same_output_is_refused_while_the_first_holds_it(shards, tmp_path):
    from pipeline.train.run_claim import run_lease

    run_dir = str(tmp_path / "run")
    with run_lease(run_dir):  # the first run, still going
        with pytest.raises(TrainError, match=f"run directory {run_dir} is in use by another run"):
            prepare_run(cfg_for(shards, run_dir, "softmax.negatives=100"))
        assert not os.path.exists(os.path.join(run_dir, "run.json"))
    prepare_run(cfg_for(shards, run_dir, "softmax.negatives=100"))  # once it ended

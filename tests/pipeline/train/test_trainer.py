"""The training loop (pipeline/train/trainer.py) around the step: nothing the loop hands on at a
logged row (a metrics row, a checkpoint, a row for the driver's console) makes a step wait."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import traceback
import types

import pytest
import ray
import torch
from shard_builder import sample_sentences, write_sample_shards

from pipeline.config import load_config
from pipeline.output_folder import LEASE_FILE
from pipeline.runtime import storage
from pipeline.train import checkpoint as ckpt
from pipeline.train.config import TrainConfig
from pipeline.train.errors import TrainError
from pipeline.train.launch import prepare_run
from pipeline.train.metrics import read_metrics
from pipeline.train.run_dir import METRICS_FILE, RunDir
from pipeline.train.trainer import Trainer

STEPS = 12


@ray.remote(num_cpus=0)
class HeldRelay:
    """A driver's side that takes nothing until released: each ``put`` waits for ``release``."""

    def __init__(self):
        self.released = asyncio.Event()
        self.taken = 0

    async def open(self) -> int:
        return 1

    async def put(self, stream, seq, row):
        await self.released.wait()
        self.taken += 1

    async def release(self):
        self.released.set()

    async def stop_requested(self) -> bool:  # the stop check's question (pipeline/train/stop.py)
        return False

    async def count(self):
        return self.taken


def tiny_run(tmp_path, steps: int) -> TrainConfig:
    """``tiny`` on the sample's shards for ``steps`` steps: a row and a checkpoint every 1 and 2."""
    sentences = sample_sentences(600)
    shards = str(tmp_path / "shards")
    write_sample_shards(shards, sentences[:-100], sentences[-100:])
    return load_config(
        TrainConfig,
        preset="tiny",
        overrides=[
            f"shards={shards}",
            f"output={tmp_path / 'run'}",
            "workers=1",
            f"max_steps={steps}",
            "log_every=1",
            "checkpoint_every=2",
            "eval_max_batches=1",
            "guard.enabled=false",
            "wandb.mode=disabled",
        ],
    )


def test_no_step_waits_for_the_storage_or_the_driver(tmp_path, ray_local, monkeypatch):
    cfg = tiny_run(tmp_path, STEPS)
    plan = prepare_run(cfg)
    gate, written = threading.Event(), []

    def held(write):
        def wait_then_write(path, data):
            if str(path).endswith(METRICS_FILE):
                assert gate.wait(timeout=120)
                written.append(path)
            return write(path, data)

        return wait_then_write

    # the run's record waits until the gate opens (a checkpoint waits for the one before it:
    # that back-pressure is counted, checkpoint/wait_s, and not held here)
    for name in ("write_bytes", "append_local"):
        monkeypatch.setattr(storage, name, held(getattr(storage, name)))
    relay = HeldRelay.remote()
    trainer = Trainer(cfg, plan, torch.device("cpu"), relay=relay)
    result: list[dict] = []
    running = threading.Thread(target=lambda: result.append(trainer.run()))
    running.start()
    deadline = time.monotonic() + 120
    # the last step's checkpoint is the one save that waits (for the ones before it to be written)
    while trainer.step < STEPS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trainer.step == STEPS and written == [] and ray.get(relay.count.remote()) == 0
    gate.set()
    ray.get(relay.release.remote(), timeout=60)
    running.join(timeout=120)
    assert result and result[0]["status"] == "done"
    rows = read_metrics(RunDir(plan.run_dir).metrics)
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, STEPS + 1))
    assert [s for s, _ in ckpt.list_checkpoints(plan.run_dir)] == [STEPS - 2, STEPS]
    handed = STEPS + 2  # every train row, the final evaluation and the status (the calls still arriving)
    while ray.get(relay.count.remote(), timeout=60) < handed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray.get(relay.count.remote(), timeout=60) == handed
    ray.kill(relay)


def test_a_workers_pipeline_error_leaves_without_its_chained_internals(monkeypatch):
    """What Ray prints of a worker's failure is the one line the driver says, not the storage
    client's chain of urllib3 and botocore frames."""
    from pipeline.train import trainer as trainer_mod

    class Failing:
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            try:
                raise ConnectionError("urllib3: read timed out")
            except ConnectionError as exc:
                raise storage.StorageError("s3://b/run/checkpoints: cannot reach S3 endpoint") from exc

    monkeypatch.setattr(trainer_mod, "Trainer", Failing)
    cfg = types.SimpleNamespace(threads_per_worker=torch.get_num_threads())
    with pytest.raises(storage.StorageError) as err:
        trainer_mod.train_loop_per_worker(
            {"config": cfg, "plan": types.SimpleNamespace(use_gpu=False), "relay": None}
        )
    assert err.value.__cause__ is None and err.value.__suppress_context__
    printed = "".join(traceback.format_exception(err.value))
    assert "urllib3" not in printed and "def run" not in printed and printed.count("\n") <= 6, printed


def test_a_run_whose_directory_was_taken_over_writes_nothing_more(tmp_path):
    """A driver stopped past its lease's ttl (Ctrl-Z, a frozen VM) while its workers trained on
    lost the directory to another run: the workers' next write finds another owner in lease.json
    and the run stops in one line, with nothing of it written beside the other run's files."""
    cfg = tiny_run(tmp_path, 6)
    plan = dataclasses.replace(prepare_run(cfg), lease_owner="this-driver:1:aa")
    other = {"owner": "other-driver:2:bb", "host": "elsewhere", "pid": 2, "heartbeat": time.time()}
    storage.write_bytes(storage.join(plan.run_dir, LEASE_FILE), json.dumps(other).encode())
    with pytest.raises(TrainError) as err:
        Trainer(cfg, plan, torch.device("cpu")).run()
    message = str(err.value)
    assert message.startswith(
        f"run directory {plan.run_dir} was taken over by another run (host elsewhere, pid 2)"
    )
    assert "\n" not in message
    assert not storage.exists(RunDir(plan.run_dir).metrics)
    assert ckpt.list_checkpoints(plan.run_dir) == []

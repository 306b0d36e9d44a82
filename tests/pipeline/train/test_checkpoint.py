import os
import threading
import time

import pytest
import torch
from polling import wait_until

from pipeline.runtime import storage
from pipeline.train import checkpoint as ckpt


def _write(run_dir: str, step: int, world: int = 2, complete: bool = True) -> str:
    path = ckpt.checkpoint_path(run_dir, step)
    for rank in range(world):
        ckpt.save_rank(path, rank, {"rank": rank, "step": step})
    ckpt.save_model(path, {"step": step, "weights": torch.arange(3.0)})
    if complete:
        ckpt.mark_complete(path, step, world)
    return path


def test_only_complete_checkpoints_count(tmp_path):
    run = str(tmp_path / "run")
    _write(run, 10)
    _write(run, 20)
    _write(run, 30, complete=False)  # a run killed while writing it
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [10, 20]
    assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_path(run, 20)
    assert ckpt.load_model(ckpt.latest_checkpoint(run))["step"] == 20
    assert ckpt.load_rank(ckpt.latest_checkpoint(run), 1, 2) == {"rank": 1, "step": 20}


def test_prune_keeps_the_newest_k_and_drops_older_partials(tmp_path):
    run = str(tmp_path / "run")
    for step in (10, 20):
        _write(run, step)
    _write(run, 25, complete=False)
    _write(run, 30)
    _write(run, 40)
    deleted = ckpt.prune(run, keep=2)
    assert [os.path.basename(p) for p in deleted] == ["step-000000010", "step-000000020", "step-000000025"]
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [30, 40]
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["step-000000030", "step-000000040"]


def test_world_size_mismatch_is_a_clear_error(tmp_path):
    run = str(tmp_path / "run")
    path = _write(run, 10, world=2)
    with pytest.raises(ckpt.CheckpointError, match="written by 2 workers; resume it with workers=2"):
        ckpt.load_rank(path, 0, 3)


def test_unreadable_checkpoint_names_the_file(tmp_path):
    run = str(tmp_path / "run")
    path = _write(run, 10)
    storage.write_bytes(storage.join(path, ckpt.MODEL_FILE), b"not a checkpoint")
    with pytest.raises(ckpt.CheckpointError, match="model.pt cannot be read"):
        ckpt.load_model(path)


def test_checkpoints_on_s3(s3_prefix):
    run = storage.join(s3_prefix, "run")
    for step in (5, 10, 15):
        _write(run, step)
    ckpt.prune(run, keep=1)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [15]
    assert ckpt.load_model(ckpt.latest_checkpoint(run))["weights"].tolist() == [0.0, 1.0, 2.0]


def test_rng_states_round_trip():
    import random

    import numpy as np

    gen = torch.Generator().manual_seed(3)
    part = ckpt.RNGStates(gen)
    states = part.state_dict()
    expected = (torch.rand(3), torch.rand(2, generator=gen), np.random.rand(2), random.random())
    part.load_state_dict(states)
    torch.testing.assert_close(torch.rand(3), expected[0])
    torch.testing.assert_close(torch.rand(2, generator=gen), expected[1])
    assert np.random.rand(2).tolist() == expected[2].tolist() and random.random() == expected[3]


class _Part:
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, state):
        self.value = float(state["value"])


def test_checkpointer_saves_when_due_and_restores_every_part(tmp_path):
    run = str(tmp_path / "run")
    shared, own = _Part(1.0), _Part(2.0)
    saver = ckpt.Checkpointer(
        run, 0, 1, every=10, keep=2, shared={"w": shared}, own={"d": own}, meta={"options": {"a": 1}}
    )
    assert not saver.save(5) and saver.save(10) and saver.save(13, last_step=True)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [10, 13]
    shared.value, own.value = 7.0, 8.0
    restorer = ckpt.Checkpointer(
        run, 0, 1, every=10, keep=2, shared={"w": shared}, own={"d": own}, meta={"options": {"a": 1}}
    )
    assert restorer.restore() == 13 and (shared.value, own.value) == (1.0, 2.0)
    other = ckpt.Checkpointer(
        run, 0, 1, every=10, keep=2, shared={"w": shared}, own={"d": own}, meta={"options": {"a": 2}}
    )
    with pytest.raises(ckpt.CheckpointError, match="different model"):
        other.restore()


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    """A pickle whose loading calls os.system: weights-only loading refuses it before it runs."""
    run = str(tmp_path / "run")
    path = _write(run, 10)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import io
    import pickle

    buf = io.BytesIO()
    pickle.dump({"step": 10, "x": Evil()}, buf, protocol=2)
    storage.write_bytes(storage.join(path, ckpt.MODEL_FILE), buf.getvalue())
    with pytest.raises(ckpt.CheckpointError, match="tampered with"):
        ckpt.load_model(path)
    assert not marker.exists()


# ---- saving in the background ------------------------------------------------------------------


class _Tensor:
    """A part whose state_dict hands out its live tensor, as a module's or an optimizer's does."""

    def __init__(self, values, device="cpu"):
        self.tensor = torch.tensor(values, dtype=torch.float32, device=device)

    def state_dict(self):
        return {"t": self.tensor}

    def load_state_dict(self, state):
        self.tensor.copy_(state["t"])


def _checkpointer(run, part, rank=0, world=1, **kwargs):
    return ckpt.Checkpointer(
        run,
        rank,
        world,
        every=10,
        keep=2,
        shared={"w": part},
        own={"d": part},
        meta={"options": {}},
        **kwargs,
    )


@pytest.fixture
def gated_writes(monkeypatch):
    """Holds every checkpoint file write until the returned event is set."""
    gate = threading.Event()
    save_file = ckpt._save_file

    def held(file, payload):
        assert gate.wait(timeout=30)
        save_file(file, payload)

    monkeypatch.setattr(ckpt, "_save_file", held)
    yield gate
    gate.set()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_background_save_holds_the_state_of_its_step(tmp_path, gated_writes, device):
    run = str(tmp_path / "run")
    part = _Tensor([1.0, 2.0], device)
    saver = _checkpointer(run, part)
    assert saver.save(10)  # returns with the files still to be written
    part.tensor.add_(100.0)  # training goes on changing the live tensors
    assert ckpt.list_checkpoints(run) == []
    gated_writes.set()
    saver.wait()
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [10]
    assert _checkpointer(run, part).restore() == 10 and part.tensor.tolist() == [1.0, 2.0]


def test_the_time_a_save_waits_for_the_previous_one_is_counted(tmp_path, gated_writes):
    run = str(tmp_path / "run")
    saver = _checkpointer(run, _Tensor([1.0]))
    assert saver.save(10)  # nothing in flight: no wait
    first = saver.take_metrics()
    assert first["checkpoint/wait_s"] == 0.0 and first["checkpoint/save_s"] > 0
    # the storage takes 0.3 s more for step 10's files: the save of step 20 waits for them
    threading.Timer(0.3, gated_writes.set).start()
    assert saver.save(20)
    metrics = saver.take_metrics()
    assert 0.25 < metrics["checkpoint/wait_s"] <= metrics["checkpoint/save_s"]
    assert saver.take_metrics() == {"checkpoint/save_s": 0.0, "checkpoint/wait_s": 0.0}  # counted once
    saver.wait()
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [10, 20]


def test_a_failed_background_save_raises_in_the_loop_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    part = _Tensor([1.0])
    saver = _checkpointer(run, part)
    saver.save(10)
    saver.wait()
    failed = threading.Event()

    def broken(file, payload):
        failed.set()
        raise storage.StorageError(f"{file}: connection reset")

    monkeypatch.setattr(ckpt, "_save_file", broken)
    assert saver.save(20)
    assert failed.wait(timeout=30)
    # the original error (a StorageError: launch retries those) at the loop's next question
    with pytest.raises(storage.StorageError, match="rank-00000.pt: connection reset"):
        for step in range(21, 30):
            saver.due(step, last_step=False)
            time.sleep(0.01)
    saver.wait()  # raised once
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [10]


def test_rank_zero_completes_a_checkpoint_once_every_rank_wrote_its_file(tmp_path):
    run = str(tmp_path / "run")
    zero, one = _checkpointer(run, _Tensor([0.0]), 0, 2), _checkpointer(run, _Tensor([1.0]), 1, 2)
    zero.save(10)
    own = os.path.join(ckpt.checkpoint_path(run, 10), ckpt.rank_file(0))
    wait_until(lambda: os.path.exists(own), "rank 0's file")
    assert ckpt.list_checkpoints(run) == []  # rank 0's files are written; rank 1's is missing
    one.save(10)
    one.wait()
    zero.wait()
    path = ckpt.checkpoint_path(run, 10)
    assert ckpt.list_checkpoints(run) == [(10, path)]
    assert [ckpt.load_rank(path, r, 2)["d"]["t"].tolist() for r in (0, 1)] == [[0.0], [1.0]]
    # the last step's save waits: once rank 0's returns, the checkpoint is complete
    assert one.save(13, last_step=True) and zero.save(13, last_step=True)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [10, 13]


def test_rank_zero_gives_up_on_a_rank_that_never_writes(tmp_path):
    run = str(tmp_path / "run")
    zero = _checkpointer(run, _Tensor([0.0]), 0, 2, ranks_timeout_s=0.2)
    zero.save(10)
    with pytest.raises(TimeoutError, match="rank 1's rank-00001.pt did not appear within 0.2 s"):
        zero.wait()
    assert ckpt.list_checkpoints(run) == []


def test_restore_drops_the_incomplete_checkpoints_of_an_earlier_attempt(tmp_path):
    run = str(tmp_path / "run")
    part = _Tensor([5.0])
    _checkpointer(run, part).save(10, last_step=True)
    stale = ckpt.checkpoint_path(run, 20)
    ckpt.save_rank(stale, 1, {"d": {"t": torch.zeros(1)}})  # killed before rank 0 completed it
    (tmp_path / "run" / "checkpoints" / "step-000000020" / ".model.pt.0a1b.elmo-partial").write_bytes(b"x")
    part.tensor.zero_()
    assert _checkpointer(run, part).restore() == 10 and part.tensor.tolist() == [5.0]
    assert not os.path.exists(stale)


def test_background_checkpoint_streams_to_s3_in_parts(s3_prefix):
    run = storage.join(s3_prefix, "run")
    part = _Tensor([0.0])
    part.tensor = torch.arange(3 * 1024 * 1024, dtype=torch.float32)  # 12 MiB: a multipart upload
    saver = _checkpointer(run, part)
    saver.save(10)
    saver.wait()
    assert ckpt.load_model(ckpt.latest_checkpoint(run))["w"]["t"].equal(part.tensor)

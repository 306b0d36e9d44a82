import os

import pytest
import torch

from pipeline import storage
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

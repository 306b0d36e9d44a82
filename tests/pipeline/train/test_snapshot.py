import pytest
import torch

from pipeline.train.snapshot import HostSnapshot


def test_snapshot_copies_tensors_once_and_rebuilds_containers():
    shared = torch.ones(2)
    payload = {"a": shared, "b": [shared, (1, "x")], "c": b"vocab"}
    taken = HostSnapshot().take(payload)
    shared.add_(1.0)
    taken.wait()
    copy = taken.payload
    assert copy["a"].tolist() == [1.0, 1.0] and copy["b"][0] is copy["a"]
    assert copy["b"][1] == (1, "x") and copy["c"] == b"vocab" and copy["b"] is not payload["b"]


def test_cpu_tensors_are_copied_at_once_and_nothing_is_kept_between_saves():
    host = HostSnapshot()
    weights = torch.arange(6.0).view(2, 3)[:, 1:]  # a view: copied compact, values kept
    taken = host.take({"w": weights})
    assert taken.events == [] and host.pinned_bytes == 0
    assert taken.payload["w"].tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert taken.payload["w"].untyped_storage().nbytes() == 4 * 4


@pytest.mark.cuda
def test_device_tensors_land_in_pinned_buffers_reused_from_one_save_to_the_next():
    host = HostSnapshot()
    state = {"w": torch.arange(4.0, device="cuda"), "steps": torch.ones(3, device="cuda")}
    first = host.take({"own": state})
    first.wait()
    buffer = first.payload["own"]["w"]
    assert buffer.is_pinned() and buffer.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert host.pinned_bytes == 4 * 4 + 3 * 4
    state["w"].mul_(10.0)
    second = host.take({"own": state})
    second.wait()
    assert second.payload["own"]["w"].data_ptr() == buffer.data_ptr()  # the same host memory
    assert second.payload["own"]["w"].tolist() == [0.0, 10.0, 20.0, 30.0]
    # a tensor of another shape gets a new buffer; one no longer saved is let go
    third = host.take({"own": {"w": torch.zeros(8, device="cuda")}})
    third.wait()
    assert third.payload["own"]["w"].data_ptr() != buffer.data_ptr() and host.pinned_bytes == 8 * 4


@pytest.mark.cuda
def test_the_copy_holds_the_values_of_its_step_while_the_next_step_is_already_queued():
    weights = torch.randn(4096, 1024, device="cuda")
    want = weights.cpu()
    other = torch.randn(4096, 4096, device="cuda")
    taken = HostSnapshot().take({"w": weights})  # returns with the copy still queued
    for _ in range(20):  # the next steps, queued behind the copy on the same stream, change the weights
        weights.add_(other[:, :1024] @ torch.eye(1024, device="cuda"))
    taken.wait()
    assert torch.equal(taken.payload["w"], want)
    assert not torch.equal(weights.cpu(), want)

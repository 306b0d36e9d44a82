"""wandb's offline run files read as untrusted input (pipeline/tracking/offline_reader.py): what is
not a run file, damaged or too deep is one line naming the file; a run killed mid-write keeps its
whole records; a link to a device is never read."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from offline_runs import log_stage_run

from pipeline.tools.dashboard_picture import main as picture_main
from pipeline.tracking import offline_reader
from pipeline.tracking.config import WandbConfig
from pipeline.tracking.offline_reader import OfflineFileError
from pipeline.tracking.stage_run import StageLog


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """A real offline run file: a shard stage's run with a summary."""
    out = tmp_path_factory.mktemp("shards")
    log_stage_run(WandbConfig(group="g"), str(out), StageLog("shard", {}, {"train/tokens": 5}))
    [path] = offline_reader.run_files(out / "wandb")
    return path


def _record(payload: bytes, kind: int = 1) -> bytes:
    return struct.pack("<IHB", zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF, len(payload), kind) + payload


def test_a_real_file_reads_and_its_torn_half_keeps_its_whole_records(run_file, tmp_path):
    recs = offline_reader.records(run_file)
    assert offline_reader.run_record(recs)["job_type"] == "shard"
    torn = tmp_path / "torn.wandb"
    data = run_file.read_bytes()
    torn.write_bytes(data[: len(data) // 2])
    kept = offline_reader.records(torn)
    assert 0 < len(kept) < len(recs) and kept == recs[: len(kept)]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "no :W&B header"),
        (random.Random(1).randbytes(5000), "no :W&B header"),
        (b":W&B\xbe\xe1\x00" + bytes(range(7, 250)) * 20, "a damaged record at byte 7"),
        (b":W&B\xbe\xe1\x00" + b"\x00\x00\x00\x00\x05\x00\x01" + b"hello", "its crc is not"),
        (b":W&B\xbe\xe1\x00" + _record(b"\xff" * 40), "is not a wandb record"),
    ],
    ids=["empty", "random", "bytes-after-the-header", "a-wrong-crc", "valid-crc-around-a-bad-protobuf"],
)
def test_what_wandb_did_not_write_is_one_line_naming_the_file(tmp_path, content, said):
    path = tmp_path / "run-x.wandb"
    path.write_bytes(content)
    with pytest.raises(OfflineFileError) as err:
        offline_reader.records(path)
    assert str(err.value).startswith(f"wandb run file {path}: ") and said in str(err.value)
    assert "\n" not in str(err.value)


def test_a_link_to_a_device_is_refused_unread(tmp_path):
    link = tmp_path / "run-x.wandb"
    link.symlink_to("/dev/zero")
    with pytest.raises(OfflineFileError, match="not a regular file"):
        offline_reader.records(link)


def test_a_value_nested_past_the_parser_is_one_line():
    deep = {"key": "x", "value_json": "[" * 200_000 + "]" * 200_000}
    with pytest.raises(OfflineFileError, match="logged value 'x' is not JSON a reader takes"):
        offline_reader.history([{"type": "history", "item": [deep]}])


def test_the_picture_tool_says_so_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "demo" / "shards" / "wandb" / "attempt-001" / "wandb" / "offline-run-1-x"
    run_dir.mkdir(parents=True)
    (run_dir / "run-x.wandb").write_bytes(b":W&B\xbe\xe1\x00" + bytes(range(7, 250)))
    assert picture_main([str(tmp_path / "demo"), str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: wandb run file ") and "damaged record" in err[0]

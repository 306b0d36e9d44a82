import gzip

import pytest

from pipeline.shard.errors import ShardError
from pipeline.shard.reader import iter_chunks, resolve_inputs
from pipeline.shard.sentences import raw_lines


def _lines_of(chunks):
    return [line for c in chunks for line in raw_lines(c.data)]


def test_chunks_end_at_newlines_whatever_the_chunk_size(tmp_path):
    lines = [f"line {i} ".encode() * (i % 7 + 1) for i in range(300)]
    path = tmp_path / "corpus.txt.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines)))  # last line without newline
    for chunk_bytes in (7, 100, 1 << 20):
        chunks = list(iter_chunks([str(path)], chunk_bytes, max_line_bytes=0))
        assert _lines_of(chunks) == lines
        assert all(c.data.endswith(b"\n") for c in chunks[:-1])
        assert [c.index for c in chunks] == list(range(len(chunks)))


def test_reader_skips_an_overlong_line_without_holding_it(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"short\n" + b"y" * 5000 + b"\nafter\n" + b"z" * 5000)
    chunks = list(iter_chunks([str(path), str(path)], chunk_bytes=64, max_line_bytes=100))
    assert _lines_of(chunks) == [b"short", b"after"] * 2
    assert max(len(c.data) for c in chunks) <= 64 + 100
    assert sum(c.overlong for c in chunks) == 4
    assert {c.source for c in chunks} == {0, 1}


def test_input_errors(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    assert resolve_inputs([str(tmp_path / "*.txt"), str(tmp_path / "a.txt")], "input") == [
        str(tmp_path / "a.txt"),
        str(tmp_path / "b.txt"),
    ]
    with pytest.raises(ShardError, match="input .*missing.txt: no such file"):
        resolve_inputs([str(tmp_path / "missing.txt")], "input")
    with pytest.raises(ShardError, match="no file or object matches"):
        resolve_inputs([str(tmp_path / "*.gz")], "input")
    fake = tmp_path / "fake.gz"
    fake.write_text("not gzip\n")
    with pytest.raises(ShardError, match="fake.gz: named .gz but is not gzip"):
        list(iter_chunks([str(fake)], 100, 0))
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(gzip.compress(b"abc\n" * 1000)[:-20])
    with pytest.raises(ShardError, match="cannot read input .*cut.txt.gz"):
        list(iter_chunks([str(truncated)], 100, 0))
    xz = tmp_path / "corpus.txt"  # compressed data is known by its bytes, not its name
    xz.write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 20)
    with pytest.raises(
        ShardError, match="corpus.txt: xz-compressed data; decompress it, or compress it with gzip"
    ):
        list(iter_chunks([str(xz)], 100, 0))

import gzip
import json

import pyarrow.parquet as pq
import zstandard

from benchmarks.record_corpus import documents, main


def test_documents_are_the_lines_in_order_in_runs_of_5_to_50():
    lines = [f"line {i}." for i in range(1000)]
    docs = documents(lines, seed=3)
    assert " ".join(docs) == " ".join(lines)
    sizes = [d.count(".") for d in docs]
    assert all(5 <= n <= 50 for n in sizes[:-1]) and sum(sizes) == 1000


def test_every_format_holds_the_same_records(tmp_path):
    corpus = tmp_path / "c.txt.gz"
    corpus.write_bytes(gzip.compress("".join(f"Verse {i}.\n" for i in range(120)).encode()))
    assert main([str(corpus), str(tmp_path / "out"), "--row-group", "2"]) == 0
    table = pq.read_table(tmp_path / "out" / "docs.parquet")
    rows = [json.loads(line) for line in (tmp_path / "out" / "docs.jsonl").read_text().splitlines()]
    assert table.to_pylist() == rows and pq.ParquetFile(tmp_path / "out" / "docs.parquet").num_row_groups > 1
    plain = (tmp_path / "out" / "docs.jsonl").read_bytes()
    assert gzip.decompress((tmp_path / "out" / "docs.jsonl.gz").read_bytes()) == plain
    assert (
        zstandard.ZstdDecompressor().decompress((tmp_path / "out" / "docs.jsonl.zst").read_bytes()) == plain
    )

"""A sentence-per-line corpus as the record corpora people publish: documents of 5-50 lines (a
seeded draw), written as Parquet (``text`` and ``id`` columns, row groups of ``--row-group``
documents) and JSON Lines (plain, gzip, zstd), for the record-corpus benchmark and demo (issue 63).

    python benchmarks/record_corpus.py pipeline/data/kjv-sample.txt.gz /tmp/kjv-records

writes ``docs.parquet``, ``docs.jsonl``, ``docs.jsonl.gz`` and ``docs.jsonl.zst`` into the folder;
a document's text is its lines joined by one space, its id ``doc-N``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path


def documents(lines: list[str], seed: int, low: int = 5, high: int = 50) -> list[str]:
    """The lines cut into documents of ``low``..``high`` lines, in order."""
    rng = random.Random(seed)
    docs, start = [], 0
    while start < len(lines):
        size = rng.randint(low, high)
        docs.append(" ".join(lines[start : start + size]))
        start += size
    return docs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="sentence-per-line text, plain or gzip")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--row-group", type=int, default=200, help="documents per Parquet row group")
    args = parser.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    opener = gzip.open if args.corpus.endswith(".gz") else open
    with opener(args.corpus, "rt", encoding="utf-8") as src:
        lines = [line.rstrip("\n") for line in src if line.strip()]
    docs = documents(lines, args.seed)
    ids = [f"doc-{i}" for i in range(len(docs))]
    args.out.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"id": ids, "text": docs}), args.out / "docs.parquet", row_group_size=args.row_group
    )
    jsonl = "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in zip(ids, docs, strict=True)).encode()
    (args.out / "docs.jsonl").write_bytes(jsonl)
    (args.out / "docs.jsonl.gz").write_bytes(gzip.compress(jsonl, mtime=0))
    (args.out / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(jsonl))
    print(f"{len(lines):,} lines -> {len(docs):,} documents in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

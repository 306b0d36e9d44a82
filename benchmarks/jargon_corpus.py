"""A second corpus for the recipe benchmarks: the Jargon File 4.4.7 (public domain), one sentence a line.

Hacker slang and computing history, a domain far from the King James Bible's, with a larger vocabulary
per token. The text comes from Debian's ``jargon-text`` package (``apt-get download jargon-text``; its
copyright file: "This document (the Jargon File) is in the public domain"). Paragraphs are joined,
the ``{cross-reference}`` braces dropped, and each paragraph split into sentences at . ! or ?
followed by a space and a capital letter.

    python benchmarks/jargon_corpus.py /tmp/jargon.txt.gz                   # downloads the package
    python benchmarks/jargon_corpus.py /tmp/jargon.txt.gz --deb jargon-text_4.4.7-4.1_all.deb
    python benchmarks/recipe_seeds.py --corpus /tmp/jargon.txt.gz --ratio 0.5 --seeds 0
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import tempfile
from pathlib import Path

TEXT_IN_PACKAGE = "usr/share/doc/jargon-text/jargon.txt.gz"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"“(\[]?[A-Z])")


def sentences(text: str) -> list[str]:
    """The sentences of the Jargon File's plain text: paragraphs (blank-line separated) joined and split."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        joined = " ".join(paragraph.split()).replace("{", "").replace("}", "")
        out.extend(s for s in _SENTENCE_END.split(joined) if len(s.split()) >= 2)
    return out


def _package_text(deb: Path | None) -> str:
    with tempfile.TemporaryDirectory(prefix="jargon-") as tmp:
        if deb is None:
            subprocess.run(["apt-get", "download", "jargon-text"], cwd=tmp, check=True, capture_output=True)
            deb = next(Path(tmp).glob("jargon-text_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        return gzip.decompress(Path(tmp, TEXT_IN_PACKAGE).read_bytes()).decode("utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the corpus to write (.txt.gz)")
    parser.add_argument("--deb", type=Path, help="the jargon-text .deb (default: apt-get download it)")
    args = parser.parse_args(argv)
    lines = sentences(_package_text(args.deb))
    with gzip.open(args.output, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    words = sum(len(line.split()) for line in lines)
    print(f"wrote {args.output}: {len(lines):,} sentences, {words:,} words")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

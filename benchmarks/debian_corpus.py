"""A real English corpus for convergence runs, from freely licensed Debian packages, one sentence a line.

    python benchmarks/debian_corpus.py /tmp/debian-corpus            # downloads the packages (apt-get download)
    python benchmarks/debian_corpus.py /tmp/debian-corpus --debs DIR # .deb files already downloaded
    python benchmarks/debian_corpus.py OUT --leave-out wordnet-base --without-probe-sentences
                                       # the reference model's corpus: no WordNet, no probe sentence
    python benchmarks/debian_corpus.py OUT --only dict-gcide --sample 0.05
                                       # the vocabulary study's dictionary corpus (high OOV rate)

Writes ``OUT/corpus.txt.gz`` (tokens separated by spaces: words, numbers and each punctuation mark apart,
as the 1B Word Benchmark is tokenized) and ``OUT/SOURCES.md`` (each package, its version, the licence
its copyright file states, and what it gave). The sources, each a different register of English:

- ``dict-gcide``: the GNU Collaborative International Dictionary of English (Webster's 1913 and
  WordNet; GPL): the definitions, without headwords, pronunciations and citations;
- ``wordnet-base``: WordNet 3.0's glosses and example sentences (the WordNet licence, BSD-like);
- ``python3.11-doc``: the Python documentation, its prose paragraphs (the PSF licence);
- ``perl-doc``: Perl's manuals (pod; Artistic or GPL), prose paragraphs;
- ``manpages``, ``manpages-dev``: the Linux man-pages (verbatim-copying and GPL licences), prose lines;
- ``jargon-text``: the Jargon File 4.4.7 (public domain);
- ``fortunes``: the fortune cookies (their copyright file: each fortune's own status, the collection
  distributable);
- ``debian-reference-en``: the Debian Reference (GPL-2+);
- ``postgresql-doc-15``, ``sqlite3-doc``, ``python-django-doc``: the PostgreSQL (PostgreSQL licence),
  SQLite (public domain) and Django (BSD) manuals, the text of their HTML paragraphs;
- ``linux-doc-6.1``: the Linux kernel's documentation (GPL-2), prose paragraphs of its reStructuredText.

Sentences are cut at . ! or ? followed by a capital; lines shorter than 3 tokens or longer than 200,
mostly non-words (code, tables), or seen before are dropped. The corpus travels to a GPU machine
beside the packages it needs (``infra/gpu_site.sh``, 31 MB) and is sharded there, where 16 cores do
it in seconds: xz-compressed (``zcat OUT/corpus.txt.gz | xz -9 -T0 > .whl/corpus.txt.xz``, about 15 MB
against gzip's 20-24) to stay under a call's 64 MiB.
"""

from __future__ import annotations

import argparse
import gzip
import html
import re
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.jargon_corpus import TEXT_IN_PACKAGE as JARGON_TEXT  # noqa: E402
from benchmarks.jargon_corpus import sentences as split_sentences  # noqa: E402

_TOKEN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*|\d+(?:[.,]\d+)*|[^\sA-Za-z\d]")
MIN_TOKENS, MAX_TOKENS = 3, 200
MIN_WORD_SHARE = 0.6
"""A line whose tokens are less than this share words is code, a table or a formula: dropped."""


def tokenize(sentence: str) -> list[str]:
    return _TOKEN.findall(sentence)


def keep(tokens: list[str]) -> bool:
    if not MIN_TOKENS <= len(tokens) <= MAX_TOKENS:
        return False
    return sum(t[0].isalpha() for t in tokens) >= MIN_WORD_SHARE * len(tokens)


# ---- one extractor per package: the package's files -> paragraphs of prose --------------------------


def gcide(root: Path) -> Iterator[str]:
    text = gzip.decompress((root / "usr/share/dictd/gcide.dict.dz").read_bytes()).decode("utf-8", "replace")
    for entry in re.split(r"\n\s*\n", text):
        lines = entry.split("\n")[1:]  # the headword line: the word, its pronunciation, its etymology
        body = " ".join(line.strip() for line in lines)
        body = re.sub(r"\[[^\]]*\]", " ", body)  # [1913 Webster], [R.], [Obs.]
        body = re.sub(r"--[A-Z][\w. ]*?\.", " ", body)  # --Bailey.
        body = re.sub(r"^\s*\d+\.\s*", "", body)
        yield from re.split(r"\s\d+\.\s", body)  # numbered senses


def wordnet(root: Path) -> Iterator[str]:
    for part in ("noun", "verb", "adj", "adv"):
        for line in (root / f"usr/share/wordnet/data.{part}").read_text("utf-8", "replace").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue  # the licence header
            for piece in line.split(" | ", 1)[1].split(";"):
                piece = piece.strip().strip('"').strip()
                if piece:
                    yield piece[0].upper() + piece[1:] + ("" if piece[-1] in ".!?" else ".")


_INFO_NOTE = re.compile(r"\*[Nn]ote\s+([^:]+?)::?[^.,;)]*[.,;)]?")
_RULE = re.compile(r"^\s*[-=*.~_]{3,}\s*$")


def _prose_paragraphs(text: str) -> Iterator[str]:
    """Blank-line separated paragraphs of a plain-text manual, lines joined: menu entries, node
    headers and underlines out, a bullet's star off, cross-references (``*note X: 1c.``) as their
    name. Code and tables stay in and are dropped by ``keep`` (mostly not words)."""
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [
            line.strip()
            for line in paragraph.split("\n")
            if not (_RULE.match(line) or line.startswith("File: ") or re.match(r"^\s*\* [^:]*::", line))
        ]
        joined = " ".join(line[2:] if line.startswith("* ") else line for line in lines)
        yield _INFO_NOTE.sub(lambda m: m.group(1), joined)


def python_doc(root: Path) -> Iterator[str]:
    yield from _prose_paragraphs(
        gzip.decompress((root / "usr/share/info/python3.11.info.gz").read_bytes()).decode("utf-8", "replace")
    )


_POD_CODE_MULTI = re.compile(r"[A-Z]<<+\s(.*?)\s>>+")  # C<< $x->y >>: may hold > itself
_POD_CODE = re.compile(r"[A-Z]<([^<>]*)>")


def perl_doc(root: Path) -> Iterator[str]:
    for pod in sorted(root.glob("usr/share/perl/*/pod/*.pod")):
        for paragraph in re.split(r"\n\s*\n", pod.read_text("utf-8", "replace")):
            if paragraph.startswith(("=", " ", "\t")):
                continue  # commands and verbatim (code) paragraphs
            text = " ".join(paragraph.split())
            text = _POD_CODE_MULTI.sub(lambda m: m.group(1), text)
            for _ in range(3):  # nested codes: B<C<...>>
                text = _POD_CODE.sub(lambda m: m.group(1).split("|")[0], text)
            yield text


_ROFF_ESCAPE = re.compile(r"\\(f[BIRP]|f\(..|\(..|\*.|[-&e])")


def manpages(root: Path) -> Iterator[str]:
    for page in sorted(root.glob("usr/share/man/man*/*.gz")):
        paragraph: list[str] = []
        for line in gzip.decompress(page.read_bytes()).decode("utf-8", "replace").splitlines():
            if line.startswith((".", "'")):
                macro, _, rest = line.partition(" ")
                if macro in (".B", ".I", ".BR", ".IR", ".RB", ".RI", ".BI", ".IB") and rest:
                    paragraph.append(rest.replace('"', ""))
                elif macro in (".PP", ".P", ".LP", ".SH", ".SS", ".TP", ".IP", ".nf", ".EX"):
                    yield " ".join(paragraph)
                    paragraph = []
                continue
            paragraph.append(line)
        yield " ".join(paragraph)


def _cleaned_roff(text: str) -> str:
    return _ROFF_ESCAPE.sub(lambda m: "-" if m.group(1) == "-" else "", text)


def jargon(root: Path) -> Iterator[str]:
    yield from re.split(r"\n\s*\n", gzip.decompress((root / JARGON_TEXT).read_bytes()).decode("utf-8"))


def fortunes(root: Path) -> Iterator[str]:
    for path in sorted((root / "usr/share/games/fortunes").glob("*")):
        if path.suffix or path.is_dir() or path.is_symlink():
            continue  # the .dat indexes and the .u8 links
        for cookie in re.split(r"\n%\n", path.read_text("utf-8", "replace")):
            if not re.search(r"^\s*--", cookie, re.M):  # attributions are lists of names
                yield " ".join(cookie.split())


def debian_reference(root: Path) -> Iterator[str]:
    text = gzip.decompress((root / "usr/share/debian-reference/debian-reference.en.txt.gz").read_bytes())
    yield from _prose_paragraphs(text.decode("utf-8", "replace"))


_TAG = re.compile(r"<[^>]+>")
_HTML_PARAGRAPH = re.compile(r"<p[\s>].*?</p>", re.S)


def _html_paragraphs(files: Iterable[Path]) -> Iterator[str]:
    """The text of every ``<p>`` of HTML pages (tags out, entities decoded)."""
    for path in files:
        for match in _HTML_PARAGRAPH.finditer(path.read_text("utf-8", "replace")):
            yield html.unescape(_TAG.sub(" ", match.group(0)))


def postgresql_doc(root: Path) -> Iterator[str]:
    yield from _html_paragraphs(sorted(root.glob("usr/share/doc/postgresql-doc-*/html/*.html")))


def sqlite_doc(root: Path) -> Iterator[str]:
    yield from _html_paragraphs(sorted(root.glob("usr/share/doc/sqlite3/**/*.html")))


def django_doc(root: Path) -> Iterator[str]:
    pages = sorted(root.glob("usr/share/doc/python-django-doc/html/**/*.html"))
    yield from _html_paragraphs(p for p in pages if "/_modules/" not in str(p))  # _modules: source code


_RST_ROLE = re.compile(r":\w+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LITERAL = re.compile(r"``([^`]*)``|`([^`<]*?)(?:\s*<[^>]*>)?`_*")


def linux_doc(root: Path) -> Iterator[str]:
    """The kernel's documentation (reStructuredText): prose paragraphs, roles and literals as their text."""
    for page in sorted(root.glob("usr/share/doc/linux-doc-*/Documentation/**/*.rst.gz")):
        text = gzip.decompress(page.read_bytes()).decode("utf-8", "replace")
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(".."))
        for paragraph in _prose_paragraphs(text):
            yield _RST_LITERAL.sub(lambda m: m.group(1) or m.group(2) or "", _RST_ROLE.sub(r"\1", paragraph))


@dataclass(frozen=True)
class Source:
    package: str
    paragraphs: Callable[[Path], Iterable[str]]
    clean: Callable[[str], str] = lambda text: text


SOURCES = [
    Source("dict-gcide", gcide),
    Source("wordnet-base", wordnet),
    Source("python3.11-doc", python_doc),
    Source("perl-doc", perl_doc),
    Source("manpages", manpages, _cleaned_roff),
    Source("manpages-dev", manpages, _cleaned_roff),
    Source("jargon-text", jargon),
    Source("fortunes", fortunes),
    Source("debian-reference-en", debian_reference),
    Source("postgresql-doc-15", postgresql_doc),
    Source("sqlite3-doc", sqlite_doc),
    Source("python-django-doc", django_doc),
    Source("linux-doc-6.1", linux_doc),
]


def _words(text: str) -> str:
    """A sentence's letters and digits, lowercased: the same sentence whatever its tokenization."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _sampled(line: str, fraction: float) -> bool:
    """Whether ``--sample fraction`` keeps ``line``: by its CRC-32, so the choice does not depend on
    Python's per-process string hashing."""
    return fraction >= 1.0 or zlib.crc32(line.encode("utf-8")) < fraction * 2**32


def probe_sentences() -> set[str]:
    """The shipped probe set's sentences (Brown's and WordNet's examples) as :func:`_words` keys: a
    model probed on them must not have read them (``elmo probe``'s data, docs/probe.md)."""
    from pipeline.probe.probe_set import load_probe_set

    probe = load_probe_set()
    sentences = [*probe.train.sentences, *probe.test.sentences, *probe.wsd.sentences]
    return {key for key in (_words(" ".join(s)) for s in sentences) if key}


def _unpacked(package: str, debs: Path, tmp: Path) -> tuple[Path, str]:
    """The package's files (unpacked under ``tmp``) and its version."""
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        subprocess.run(["apt-get", "download", package], cwd=debs, check=True, capture_output=True)
        found = sorted(debs.glob(f"{package}_*.deb"))
    root = tmp / package
    subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(root)], check=True)
    version = subprocess.run(
        ["dpkg-deb", "-f", str(found[-1]), "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return root, version


_LICENCE_NAMES = {
    "public domain": r"public domain",
    "GPL": r"GNU General Public License|\bGPL\b",
    "GFDL": r"GNU Free Documentation License|\bGFDL\b",
    "BSD": r"\bBSD\b|Redistribution and use in source and binary forms",
    "Artistic": r"Artistic License",
    "PSF": r"Python Software Foundation License|PSF LICENSE",
}


def licences(root: Path, package: str) -> str:
    """The licences the package's copyright file states: its ``License:`` fields (machine-readable
    files), else the licences it names."""
    path = root / "usr/share/doc" / package / "copyright"
    if not path.exists():
        return "see the package's copyright file"
    text = path.read_text("utf-8", "replace")
    fields = re.findall(r"^License:[ \t]*(\S.*)$", text, re.M)
    # short names only: some files put a licence's first line of text in the field
    names = list(dict.fromkeys(f.strip() for f in fields if len(f.split()) <= 6))
    if not names:
        names = [name for name, pattern in _LICENCE_NAMES.items() if re.search(pattern, text, re.I)]
    return ", ".join(names[:4]) if names else "see the package's copyright file"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="folder for corpus.txt.gz and SOURCES.md")
    parser.add_argument(
        "--debs", type=Path, help="folder with the .deb files (missing ones are downloaded there)"
    )
    parser.add_argument(
        "--leave-out",
        action="append",
        default=[],
        choices=[s.package for s in SOURCES],
        metavar="PACKAGE",
        help="a package to leave out (repeatable), e.g. wordnet-base for a model that elmo probe tests",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=[s.package for s in SOURCES],
        metavar="PACKAGE",
        help="take only this package (repeatable), e.g. dict-gcide for a corpus of a large vocabulary per token",
    )
    parser.add_argument(
        "--sample",
        type=float,
        default=1.0,
        help="keep this fraction of the sentences, chosen by a CRC-32 of the line (the same on any machine)",
    )
    parser.add_argument(
        "--without-probe-sentences",
        action="store_true",
        help="drop every sentence of elmo probe's set (Brown, WordNet's examples), in any package",
    )
    args = parser.parse_args(argv)
    sources = [
        s for s in SOURCES if s.package not in args.leave_out and (not args.only or s.package in args.only)
    ]
    if not 0.0 < args.sample <= 1.0:
        parser.error(f"--sample {args.sample}: expected a fraction in (0, 1]")
    held_back = probe_sentences() if args.without_probe_sentences else set()
    dropped = 0
    args.output.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    rows, total_sentences, total_tokens = [], 0, 0
    with (
        tempfile.TemporaryDirectory(prefix="debian-corpus-") as tmp,
        gzip.open(args.output / "corpus.txt.gz", "wt", encoding="utf-8", compresslevel=6) as out,
    ):
        debs = args.debs or Path(tmp)
        for source in sources:
            root, version = _unpacked(source.package, debs, Path(tmp))
            sentences = tokens = 0
            for paragraph in source.paragraphs(root):
                for sentence in split_sentences(source.clean(paragraph)):
                    words = tokenize(sentence)
                    line = " ".join(words)
                    if not keep(words) or hash(line) in seen or not _sampled(line, args.sample):
                        continue
                    if held_back and _words(line) in held_back:
                        dropped += 1
                        continue
                    seen.add(hash(line))
                    out.write(line + "\n")
                    sentences, tokens = sentences + 1, tokens + len(words)
            rows.append((source.package, version, licences(root, source.package), sentences, tokens))
            total_sentences, total_tokens = total_sentences + sentences, total_tokens + tokens
            print(f"{source.package} {version}: {sentences:,} sentences, {tokens:,} tokens", flush=True)
    table = [
        "# Sources of corpus.txt.gz",
        "",
        "Built by `python benchmarks/debian_corpus.py` from these Debian packages (`apt-get download`).",
        "",
        "| package | version | licence (its copyright file) | sentences | tokens |",
        "|---|---|---|---|---|",
        *(f"| {p} | {v} | {lic} | {s:,} | {t:,} |" for p, v, lic, s, t in rows),
        f"| all | | | {total_sentences:,} | {total_tokens:,} |",
    ]
    if args.only:
        table.append(f"\nOnly: {', '.join(args.only)}.")
    if args.sample < 1.0:
        table.append(f"\nA sample of {args.sample:g} of the sentences (`--sample`, by CRC-32 of the line).")
    if args.leave_out:
        table.append(f"\nLeft out: {', '.join(args.leave_out)}.")
    if args.without_probe_sentences:
        table.append(f"\n{dropped:,} sentences of `elmo probe`'s set dropped (the model is probed on them).")
    (args.output / "SOURCES.md").write_text("\n".join(table) + "\n")
    print(f"wrote {args.output / 'corpus.txt.gz'}: {total_sentences:,} sentences, {total_tokens:,} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

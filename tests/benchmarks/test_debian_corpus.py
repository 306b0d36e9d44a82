"""The Debian corpus builder's extractors on small files shaped like the packages' own."""

from __future__ import annotations

from benchmarks.debian_corpus import SOURCES, _words, keep, perl_doc, probe_sentences, tokenize, wordnet
from pipeline.probe.probe_set import load_probe_set


def test_tokens_split_punctuation_and_keep_contractions_and_numbers():
    assert tokenize("Don't split 3.14, (or e-mail).") == [
        "Don't", "split", "3.14", ",", "(", "or", "e", "-", "mail", ")", "."
    ]  # fmt: skip
    assert keep(tokenize("A sentence of words."))
    assert not keep(tokenize("x = f(a[1], b[2]) + 3 * 4;"))  # mostly not words: code
    assert not keep(["Hi", "."])  # too short


def test_wordnet_glosses_and_examples_become_sentences(tmp_path):
    folder = tmp_path / "usr/share/wordnet"
    folder.mkdir(parents=True)
    line = '00001740 03 n 01 entity 0 000 | that which exists; "the entity was there"  \n'
    folder.joinpath("data.noun").write_text("  1 This software and database is licensed\n" + line)
    for part in ("verb", "adj", "adv"):
        folder.joinpath(f"data.{part}").write_text("")
    assert list(wordnet(tmp_path)) == ["That which exists.", "The entity was there."]


def test_pod_prose_without_commands_code_or_formatting_codes(tmp_path):
    folder = tmp_path / "usr/share/perl/5.36/pod"
    folder.mkdir(parents=True)
    folder.joinpath("perlintro.pod").write_text(
        "=head1 NAME\n\nUse B<strict> and C<< $x->y >> with L<perlfunc|perlfunc/print>.\n\n    my $x = 1;\n"
    )
    assert list(perl_doc(tmp_path)) == ["Use strict and $x->y with perlfunc."]


def test_every_source_names_a_package_and_an_extractor():
    assert len({s.package for s in SOURCES}) == len(SOURCES) >= 8
    assert all(callable(s.paragraphs) for s in SOURCES)


def test_probe_sentences_are_recognised_however_they_were_tokenized():
    held_back = probe_sentences()
    first = load_probe_set(wsd_examples=1).wsd.sentences[0]  # a WordNet example the probe tests on
    line = " ".join(tokenize(" ".join(first).replace(" ,", ",")))  # as the builder writes it
    assert _words(line) in held_back
    assert _words("A sentence no probe has ever seen , surely .") not in held_back

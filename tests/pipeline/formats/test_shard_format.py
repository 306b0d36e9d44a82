import hashlib
import io

import numpy as np
import pytest
import webdataset as wds

from pipeline.formats import shard_format as fmt


def _write_tar(samples) -> bytes:
    buf = io.BytesIO()
    with fmt.tar_writer(buf) as tar:
        for sample in samples:
            tar.write(sample)
    return buf.getvalue()


def test_block_round_trip_through_a_webdataset_tar(tmp_path):
    sentences = [["In", "the", "beginning"], ["God", "créa", "."]]
    sample = fmt.encode_block(sentences, [5, 6, 7, 8, 2, 9], fmt.block_key("train", 3, 1))
    assert sample["__key__"] == "train-000003-000001"
    path = tmp_path / "train-000003.tar"
    path.write_bytes(_write_tar([sample]))
    (raw,) = list(wds.WebDataset(str(path), shardshuffle=False))
    block = fmt.decode_block(raw)
    assert block.sentences == sentences
    assert block.ids.dtype == np.int32 and block.ids.tolist() == [5, 6, 7, 8, 2, 9]
    assert block.lengths.tolist() == [3, 3]
    assert [a.tolist() for a in block.sentence_ids()] == [[5, 6, 7], [8, 2, 9]]
    assert [b.sentences for b in fmt.read_shard(str(path))] == [sentences]


def test_tar_bytes_do_not_depend_on_time_or_user(monkeypatch):
    sample = fmt.encode_block([["a", "b"]], [3, 4], "heldout-000000-000000")
    first = _write_tar([sample])
    monkeypatch.setattr("time.time", lambda: 1e9)
    assert _write_tar([sample]) == first
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == [
        "heldout-000000-000000.ids.npy",
        "heldout-000000-000000.lengths.npy",
        "heldout-000000-000000.sentences.txt",
    ]
    assert {(i.mtime, i.uid, i.gid, i.uname, i.mode) for i in infos} == {(0, 0, 0, "elmo", 0o444)}


@pytest.mark.parametrize(
    "sentences, ids, match",
    [
        ([["a b"]], [1], "whitespace"),
        ([["a", ""]], [1, 2], "empty token"),
        ([[]], [], "empty"),
        ([["a"]], [1, 2], r"expected \(1,\)"),
        ([["a"]], [-1], "int32 range"),
    ],
)
def test_encode_block_rejects_bad_blocks(sentences, ids, match):
    with pytest.raises(fmt.FormatError, match=match):
        fmt.encode_block(sentences, ids, "train-000000-000000")


def test_decode_block_names_the_inconsistency():
    sample = fmt.encode_block([["a", "b"], ["c"]], [3, 4, 5], "train-000000-000007")
    bad = dict(sample, **{"sentences.txt": b"a b\nc d\n"})
    with pytest.raises(fmt.FormatError, match="train-000000-000007: sentence 1 has 2 tokens"):
        fmt.decode_block(bad)
    with pytest.raises(fmt.FormatError, match="missing member 'ids.npy'"):
        fmt.decode_block({k: v for k, v in sample.items() if k != "ids.npy"})
    with pytest.raises(fmt.FormatError, match="not a valid .npy"):
        fmt.decode_block(dict(sample, **{"lengths.npy": b"junk"}))


def test_vocab_files_round_trip_and_validation(tmp_path):
    tokens = ["<S>", "</S>", "<UNK>", "the", "ünïcode"]
    path = tmp_path / "vocab.txt"
    path.write_bytes(fmt.encode_vocab(tokens))
    assert fmt.read_vocab(str(path)) == tokens
    counts = tmp_path / "vocab_counts.tsv"
    counts.write_bytes(fmt.encode_counts(tokens, [2, 2, 0, 7, 1]))
    assert fmt.read_counts(str(counts)) == list(zip(tokens, [2, 2, 0, 7, 1], strict=True))
    for text, match in [
        ("the\n<S>\n</S>\n<UNK>\n", "must start with"),
        ("<S>\n</S>\n<UNK>\nthe\nthe\n", "appears twice"),
        ("<S>\n</S>\n<UNK>\n\nx\n", "line 4 is empty"),
    ]:
        path.write_text(text)
        with pytest.raises(fmt.FormatError, match=match):
            fmt.read_vocab(str(path))


def _many_blocks_tar(tmp_path):
    samples = [
        fmt.encode_block([[f"w{b}", "x"]] * 50, [5] * 100, fmt.block_key("train", 0, b)) for b in range(20)
    ]
    data = _write_tar(samples)
    path = tmp_path / "train-000000.tar"
    path.write_bytes(data)
    return path, data, hashlib.sha256(data).hexdigest()


def test_open_shard_checks_the_whole_file_even_when_the_reader_stops_early(tmp_path):
    path, data, sha = _many_blocks_tar(tmp_path)
    with fmt.open_shard(str(path), sha) as blocks:
        assert next(blocks).sentences[0] == ["w0", "x"]  # then stops: the rest is read and hashed
    damaged = bytearray(data)
    damaged[len(data) * 3 // 4] ^= 0xFF  # a byte in a block the reader never decodes
    path.write_bytes(bytes(damaged))
    with pytest.raises(fmt.FormatError) as err:
        with fmt.open_shard(str(path), sha) as blocks:
            next(blocks)
    assert str(err.value).startswith(f"shard {path} is damaged or was replaced: sha256 ")
    with fmt.open_shard(str(path)) as blocks:  # without a hash nothing is checked
        next(blocks)


@pytest.mark.parametrize("keep", [0.3, 0.6])
def test_a_truncated_shard_is_named_truncated(tmp_path, keep):
    path, data, sha = _many_blocks_tar(tmp_path)
    cut = int(len(data) * keep) // 512 * 512  # at a tar block boundary: tarfile itself sees no error
    path.write_bytes(data[:cut])
    with pytest.raises(fmt.FormatError) as err:
        with fmt.open_shard(str(path), sha) as blocks:
            for _ in blocks:
                pass
    assert str(err.value) == (
        f"shard {path} is truncated ({cut:,} bytes, no end-of-archive marker; its sha256 differs from "
        "the manifest's): copy it again or reshard"
    )


def test_an_eval_row_names_its_baselines_weakest_first():
    row = {"eval/unigram_perplexity": 345.8, fmt.kneser_ney_metric(5): 40.4, fmt.kneser_ney_metric(3): 47.8}
    assert fmt.row_baselines(row) == [
        ("unigram", 345.8),
        ("Kneser-Ney 3-gram", 47.8),
        ("Kneser-Ney 5-gram", 40.4),
    ]
    assert fmt.row_baselines({}) == []

"""``elmo probe`` (pipeline/probe/runner.py, jobs/probe.py): the report's shape and numbers, the same
numbers on a rerun, and one clear line for a missing or malformed model or probe set."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from jobs.probe import main as probe_main
from pipeline.config import load_config
from pipeline.probe.config import ProbeConfig
from pipeline.probe.probe_set import ProbeError, load_probe_set
from pipeline.probe.runner import check_output, run_probe

MODEL = Path(__file__).resolve().parents[2] / "data" / "reference" / "allennlp"
FILES = [f"options_file={MODEL / 'options.json'}", f"weights_file={MODEL / 'lm_weights.hdf5'}"]
SMALL = ["pos_train_sentences=300", "pos_test_sentences=100", "wsd_examples=400", "threads=1"]


def _config(output: Path, *overrides: str) -> ProbeConfig:
    return load_config(
        ProbeConfig, overrides=[*FILES, *SMALL, f"output={output}", "wandb.mode=disabled", *overrides]
    )


def test_a_probe_reports_every_layer_against_its_baselines_and_the_same_again(tmp_path):
    result = run_probe(_config(tmp_path / "probe", "control=true"))
    written = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert (tmp_path / "probe" / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pos, wsd = written["probes"]["pos"], written["probes"]["wsd"]
    assert set(pos["layers"]) == {"0", "1", "2", "mix"} and set(wsd["layers"]) == {"0", "1", "2"}
    for value in [*pos["layers"].values(), pos["baseline"], *wsd["layers"].values(), wsd["baseline"]]:
        assert 0.0 <= value <= 1.0
    assert pos["test"] > 1000 and pos["train"] > 3000 and 50 < wsd["test"] <= 400
    assert set(written["control"]) == {"pos", "wsd"} and written["seconds"] > 0
    assert result.details.report["probes"] == written["probes"] and result.tokens > pos["train"] + pos["test"]
    assert result.details.written == (
        str(tmp_path / "probe" / "probe.json"),
        str(tmp_path / "probe" / "probe.png"),
    )
    again = run_probe(_config(tmp_path / "probe", "control=true"))  # an earlier probe's folder: rewritten
    assert again.details.report["probes"] == written["probes"]
    assert again.details.report["control"] == written["control"]


def test_the_cli_prints_the_table_and_refuses_what_it_cannot_probe_in_one_line(tmp_path, capsys):
    assert probe_main([*FILES, *SMALL, "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "part of speech (model)" in printed and "word sense (model)" in printed and "probe.json" in printed
    cases = [
        (["--model", str(tmp_path / "nowhere"), "--output", str(tmp_path / "a")], "does not exist"),
        ([f"options_file={MODEL / 'options.json'}", f"weights_file={MODEL / 'options.json'}", "--output", str(tmp_path / "b")], "cannot load"),
        ([*FILES, "--output", str(tmp_path / "c"), f"probe_set={tmp_path}"], "probe set"),
    ]  # fmt: skip
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    cases.append(
        ([*FILES, "--output", str(tmp_path / "mine")], "holds notes.txt, which elmo probe did not write")
    )
    for argv, message in cases:
        assert probe_main([*argv, *SMALL]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err, err


def test_the_output_is_checked_by_its_marker_before_any_work(tmp_path):
    """``probe_run.json`` (written first) names the stage and the model: a user's own ``probe.json``,
    another model's probe, a damaged marker or a file are refused in one line, before the model is
    even loaded; an earlier probe of the same model is rewritten (above)."""
    model = {"options_file": "m/options.json", "weights_file": "m/weights.hdf5"}
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "probe.json").write_text('{"my": "results"}')
    with pytest.raises(ProbeError, match="holds probe.json but no probe_run.json"):
        check_output(str(mine), model)
    other = tmp_path / "other"
    other.mkdir()
    (other / "probe_run.json").write_text(
        json.dumps({"stage": "probe", "model": {**model, "weights_file": "x.hdf5"}})
    )
    with pytest.raises(ProbeError, match=r"holds the probe of another model \(x.hdf5, probe_run.json\)"):
        check_output(str(other), model)
    for damaged in ("{}", "[]", "not json", json.dumps({"stage": "export", "run": "r"})):
        (other / "probe_run.json").write_text(damaged)
        with pytest.raises(ProbeError) as err:
            check_output(str(other), model)
        assert (
            "not an elmo probe marker" in str(err.value) or "another model" in str(err.value)
        ) and "\n" not in str(err.value)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ProbeError, match="is a file, not a folder"):
        check_output(str(tmp_path / "a-file"), model)
    (other / "probe_run.json").write_text(json.dumps({"stage": "probe", "model": model}))
    check_output(str(other), model)  # its own: fine
    assert (mine / "probe.json").read_text() == '{"my": "results"}'


def test_a_malformed_probe_set_is_named_in_one_line(tmp_path):
    (tmp_path / "pos.jsonl.gz").write_bytes(
        gzip.compress(b'{"split": "train", "tokens": ["a"], "tags": ["x", "y"]}\n')
    )
    (tmp_path / "wsd.jsonl.gz").write_bytes(gzip.compress(b"[]\n"))
    with pytest.raises(ProbeError, match=r"pos.jsonl.gz: line 1 needs split train\|test and a tag per token"):
        load_probe_set(str(tmp_path))
    (tmp_path / "pos.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ProbeError, match=r"pos.jsonl.gz: not a gzip file of JSON lines"):
        load_probe_set(str(tmp_path))


def test_the_shipped_set_and_its_samples():
    full = load_probe_set()
    assert (len(full.train.sentences), len(full.test.sentences)) == (8000, 2000)
    assert len(full.wsd.sentences) == 26858 and len(set(full.wsd.lemmas)) == 6628
    sample = load_probe_set(pos_train=100, pos_test=50, wsd_examples=1000)
    assert (len(sample.train.sentences), len(sample.test.sentences)) == (100, 50)
    assert 500 < len(sample.wsd.sentences) <= 1500
    # whole lemmas: every sampled lemma keeps all its examples
    counts = {lemma: full.wsd.lemmas.count(lemma) for lemma in set(sample.wsd.lemmas)}
    assert all(sample.wsd.lemmas.count(lemma) == n for lemma, n in counts.items())
    assert load_probe_set(pos_train=100).train.sentences == sample.train.sentences  # a fixed sample

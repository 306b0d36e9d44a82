"""The training run's bounded probe (pipeline/probe/live.py): beside the steps, on a copy of
the weights, skipped while the one before runs but for the last step's."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from elmo_model import BiLM
from pipeline.probe import live
from pipeline.probe.live import LiveProbe

MODEL = Path(__file__).resolve().parents[2] / "data" / "reference" / "allennlp"


def test_probes_run_beside_the_steps_on_the_weights_of_their_step(monkeypatch):
    monkeypatch.setattr(live, "SAMPLE", {"pos_train": 60, "pos_test": 20, "wsd_examples": 200})
    bilm = BiLM.from_files(MODEL / "options.json", MODEL / "lm_weights.hdf5").train()
    probe = LiveProbe(every=10)
    assert [probe.due(s, last=False) for s in (9, 10, 20)] == [False, True, True] and probe.due(13, last=True)
    gate = threading.Event()
    real = probe._row
    monkeypatch.setattr(probe, "_row", lambda model, step: (gate.wait(60), real(model, step))[1])
    assert probe.start(bilm, 10)
    with torch.no_grad():  # the training goes on and changes its weights: the probe has its own copy
        for p in bilm.parameters():
            p.add_(1.0)
    assert probe.ready() == [] and not probe.start(bilm, 20)  # still running: skipped
    gate.set()
    assert probe.start(bilm, 30, last=True)  # the last step's waits for the one before
    probes = probe.finish()
    rows = [p.row for p in probes]
    assert [r["step"] for r in rows] == [10, 30] and bilm.training
    assert rows[0]["probe/pos_layer0"] != rows[1]["probe/pos_layer0"]  # other weights, other numbers
    assert {"probe/pos_layer2", "probe/wsd_layer2", "probe/seconds", "probe/wsd_examples"} <= set(rows[0])
    # beside its numbers, the probe's table and chart as the dashboard shows them
    columns, table = probes[0].table
    assert columns == ["probe", "layer 0", "layer 1", "layer 2", "mix", "baseline"]
    assert table[0][1:] == [
        rows[0][f"probe/pos_{k}"] for k in ("layer0", "layer1", "layer2", "mix", "baseline")
    ]
    assert probes[0].chart[:8] == b"\x89PNG\r\n\x1a\n"
    assert LiveProbe(every=0).finish() == [] and not LiveProbe(every=0).due(10, last=True)

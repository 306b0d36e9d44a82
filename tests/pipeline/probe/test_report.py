"""The probe's results as a dashboard's table: a row per probe, a column per layer."""

from __future__ import annotations

from pipeline.probe.report import table_rows

RESULT = {
    "probes": {
        "pos": {"layers": {"0": 0.70, "1": 0.80, "2": 0.75, "mix": 0.82}, "baseline": 0.50},
        "wsd": {"layers": {"0": 0.30, "1": 0.35, "2": 0.40}, "baseline": 0.25},
    },
    "control": {
        "pos": {"layers": {"0": 0.60, "1": 0.55, "2": 0.52, "mix": 0.61}, "baseline": 0.50},
        "wsd": {"layers": {"0": 0.28, "1": 0.26, "2": 0.27}, "baseline": 0.25},
    },
}


def test_the_table_has_a_row_per_probe_and_the_controls_below():
    columns, rows = table_rows(RESULT)
    assert columns == ["probe", "layer 0", "layer 1", "layer 2", "mix", "baseline"]
    assert rows == [
        ["part of speech (model)", 0.70, 0.80, 0.75, 0.82, 0.50],
        ["word sense (model)", 0.30, 0.35, 0.40, None, 0.25],  # no mix for word sense
        ["part of speech (random control)", 0.60, 0.55, 0.52, 0.61, 0.50],
        ["word sense (random control)", 0.28, 0.26, 0.27, None, 0.25],
    ]


def test_elmo_probes_run_holds_the_table_the_chart_and_each_probes_best_layer():
    from pipeline.config import load_config
    from pipeline.probe.config import ProbeConfig
    from pipeline.probe.stage import probe_log

    cfg = load_config(ProbeConfig, overrides=["model=m", "output=o", "wandb.group=demo"])
    model = {"options_file": "m/options.json", "weights_file": "m/weights.hdf5"}
    log = probe_log(cfg, {**RESULT, "seconds": 12.5, "model": model}, b"\x89PNG")
    # the lineage: the model read, the report written
    ((used,),) = [log.uses]
    assert (used.type, used.checked) == ("model", ("m/options.json", "m/weights.hdf5"))
    assert (log.produces.type, log.produces.checked) == ("probe-report", ("o/probe.json", "o/probe.png"))
    assert (log.job_type, log.config["model"]) == ("probe", "m")
    assert log.tables == {"probe/table": table_rows(RESULT)} and log.images == {"probe/plot": b"\x89PNG"}
    assert log.summary == {
        "seconds": 12.5,
        "pos/best_layer": 1,  # the mix is no layer
        "pos/best_accuracy": 0.80,
        "pos/baseline": 0.50,
        "wsd/best_layer": 2,
        "wsd/best_accuracy": 0.40,
        "wsd/baseline": 0.25,
        "control/pos/best_layer": 0,
        "control/pos/best_accuracy": 0.60,
        "control/pos/baseline": 0.50,
        "control/wsd/best_layer": 0,
        "control/wsd/best_accuracy": 0.28,
        "control/wsd/baseline": 0.25,
    }

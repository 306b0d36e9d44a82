"""``elmo probe``: a model's layers against part of speech and word sense, from a config to a report.

Order, so that nothing is computed for a run that cannot finish: the output (new, empty or an
earlier probe's), the model files and the probe set are checked first; then the sentences are
embedded once per model (every layer, float32), the classifiers trained, the report written. The
same model gives the same numbers: the sample is fixed, the classifiers start from zeros, the
random control's initialisation is seeded.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import numpy as np
import torch

from elmo_model import BiLM, BiLMOptions
from pipeline.model_loader import check_files, load_files, model_paths, pick_device
from pipeline.output_folder import OwnFiles, check_owned, read_marker, taken_back_on_failure
from pipeline.probe import report
from pipeline.probe.config import ProbeConfig
from pipeline.probe.features import token_features
from pipeline.probe.pos_probe import probe_pos
from pipeline.probe.probe_set import ProbeError, ProbeSet, load_probe_set
from pipeline.probe.wsd_probe import probe_wsd
from pipeline.runtime import storage
from pipeline.runtime.cpu_threads import free_cores
from pipeline.stage import StageResult
from pipeline.tracking.offline_files import RUNS_PATTERN

MARKER_FILE = "probe_run.json"
"""``{"stage": "probe", "model": {"options_file", "weights_file"}}``: written first, read before a
later probe writes into the folder (``probe.json``, the report, is a name any probing tool writes)."""
OWN_FILES = OwnFiles(
    "probe",
    MARKER_FILE,
    re.compile(
        "|".join(re.escape(name) for name in (MARKER_FILE, report.JSON_FILE, report.PLOT_FILE))
        + f"|{RUNS_PATTERN}"
    ),
)


def check_output(output: str, model: dict) -> None:
    """Before any work: ``output`` is new, empty, or an earlier probe of the same ``model`` (its two
    files); ProbeError, one line, for anything else (a file, a user's ``probe.json``, another
    model's probe)."""
    try:
        if check_owned(output, OWN_FILES, ProbeError):
            theirs = read_marker(output, OWN_FILES, ProbeError).get("model")
            if theirs != model:
                what = theirs.get("weights_file") if isinstance(theirs, dict) else theirs
                raise ProbeError(
                    f"output {output} holds the probe of another model ({what}, {MARKER_FILE}): choose "
                    "another output"
                )
    except storage.StorageError as err:
        raise ProbeError(f"output {output}: {err}") from None


def write_report(output: str, result: dict) -> tuple[str, str]:
    """The marker first (it makes the folder a probe's), then ``report.write``'s two files; a
    failure in between takes the marker and the folders it made back."""
    marker = {
        "stage": OWN_FILES.stage,
        "model": {k: result["model"][k] for k in ("options_file", "weights_file")},
    }
    with taken_back_on_failure(output, OWN_FILES):
        storage.write_bytes(storage.join(output, MARKER_FILE), json.dumps(marker).encode())
        return report.write(output, result)


def random_control(bilm: BiLM, seed: int) -> BiLM:
    """A model of ``bilm``'s size with the bilm-tf random initialisation (seeded), eval, stateless."""
    torch.manual_seed(seed)
    control = BiLM.from_options(BiLMOptions.from_dict(bilm.options).to_dict())
    return control.to(next(bilm.parameters()).device).eval()


def probe_model(
    bilm: BiLM, probe_set: ProbeSet, precision: str = "float32", graphs: bool | None = None
) -> dict:
    """Both probes of one model: ``{"pos": ..., "wsd": ...}`` (``report.probes``)."""
    pos = probe_set.train, probe_set.test
    features = [token_features(bilm, split.sentences, precision, graphs) for split in pos]
    words = [[w for s in split.sentences for w in s] for split in pos]
    tags = [[t for s in split.tags for t in s] for split in pos]
    pos_result = probe_pos(features[0], tags[0], features[1], tags[1], words[0], words[1])
    wsd = probe_set.wsd
    all_tokens = token_features(bilm, wsd.sentences, precision, graphs)
    starts = np.cumsum([0, *map(len, wsd.sentences)])[:-1]
    targets = all_tokens[starts + np.array(wsd.targets, dtype=np.int64)]
    wsd_result = probe_wsd(targets, wsd.lemmas, wsd.senses, wsd.ranks)
    return report.probes(pos_result, wsd_result)


@dataclass(frozen=True)
class ProbeDetails:
    """What a probe run found and wrote."""

    report: dict
    """``probe.json``'s document (``pipeline/probe/report.py``): the model read, each probe's
    accuracy per layer (and the random control's), the probe set, the seconds."""
    written: tuple[str, str]
    """The paths of ``probe.json`` and ``probe.png``."""


def run_probe(cfg: ProbeConfig) -> StageResult[ProbeDetails]:
    """Probe ``cfg``'s model (and, with ``control``, a random one of its size); write the report to
    ``cfg.output``. Its tokens: those the probes embedded, per model."""
    started = time.perf_counter()
    output = cfg.output.rstrip("/")
    options_file, weights_file = model_paths(cfg.model, cfg.options_file, cfg.weights_file, ProbeError)
    check_output(output, {"options_file": options_file, "weights_file": weights_file})
    check_files(options_file, weights_file, cfg.model, ProbeError)
    probe_set = load_probe_set(
        cfg.probe_set, cfg.pos_train_sentences, cfg.pos_test_sentences, cfg.wsd_examples
    )
    torch.set_num_threads(cfg.threads or free_cores())
    device = pick_device(cfg.device)
    bilm = load_files(options_file, weights_file, ProbeError).to(device)
    result = {
        "model": {
            "options_file": options_file,
            "weights_file": weights_file,
            "device": device.type,
            "precision": cfg.precision.value,
        },
        "probes": probe_model(bilm, probe_set, cfg.precision.value),
    }
    if cfg.control:
        result["control"] = probe_model(random_control(bilm, cfg.seed), probe_set, cfg.precision.value)
    result["set"] = {
        "where": probe_set.where,
        "pos_train_sentences": len(probe_set.train.sentences),
        "pos_test_sentences": len(probe_set.test.sentences),
        "wsd_examples": len(probe_set.wsd.sentences),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    written = write_report(output, result)
    tokens = sum(map(len, probe_set.train.sentences + probe_set.test.sentences + probe_set.wsd.sentences))
    return StageResult("probe", output, time.perf_counter() - started, tokens, ProbeDetails(result, written))

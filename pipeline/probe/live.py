"""The bounded probe a training run logs every ``probe_every`` steps (rank 0): what its layers know
so far, on the dashboard beside the perplexity.

A fixed sample of the shipped probe set (``SAMPLE``: always the same sentences, so the curves
compare step with step) is probed on a copy of the model's weights taken at the step (on the CPU,
eval mode), in a thread beside the training: the step loop only copies the weights, and picks the
row up once the probe is done (at a later logged step, or at the end of the run), so no rank waits
for it. A probe that comes due while the one before still runs is skipped (its step has no row), but for the last step's, which
waits for it.
The row states the sample and the seconds the probe took; beside it, the probe's table (a row per
probe, a column per layer) and chart, as the dashboard shows them (`ProbeRow`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from elmo_model import BiLM
from pipeline.probe import report
from pipeline.probe.probe_set import load_probe_set
from pipeline.probe.runner import probe_model

SAMPLE = {"pos_train": 1000, "pos_test": 300, "wsd_examples": 2000}
"""Sentences of the part-of-speech probe (training, test) and word-sense examples, of the shipped set."""


def cpu_copy(bilm: BiLM) -> BiLM:
    """The model's weights as they are now, in a model of their own on the CPU (eval mode)."""
    copy = BiLM(bilm.options)
    copy.load_state_dict({k: v.detach().to("cpu", copy=True) for k, v in bilm.state_dict().items()})
    return copy.eval()


@dataclass(frozen=True)
class ProbeRow:
    """One live probe: ``row``, its numbers (kind ``probe``: metrics.jsonl, the console, the
    dashboard's curves); ``table``, the probe's table as columns and rows (``report.table_rows``);
    ``chart``, its PNG (``report.plot``)."""

    row: dict
    table: tuple[list[str], list[list]]
    chart: bytes


class LiveProbe:
    """``due(step, last)``: every ``every`` steps and at the last one (0: never); ``start(bilm,
    step)``: probe a copy of the weights in the background; ``ready()``: the `ProbeRow` of each
    probe done since; ``finish()``: those and the one still running, waited for."""

    def __init__(self, every: int):
        self.every = every
        self.sample = load_probe_set(**SAMPLE) if every else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dashboard-probe") if every else None
        self._futures: list[Future] = []

    def due(self, step: int, last: bool) -> bool:
        return bool(self.every) and (step % self.every == 0 or last)

    def start(self, bilm: BiLM, step: int, last: bool = False) -> bool:
        """Probe the weights of ``step`` beside the training; False (skipped) when the previous probe
        still runs, unless it is the run's ``last`` step (whose probe waits for it: the steps are over)."""
        if self._futures and not self._futures[-1].done():
            if not last:
                return False
            self._futures[-1].exception()  # waits; an error is raised where its row is taken
        self._futures.append(self._pool.submit(self._row, cpu_copy(bilm), step))
        return True

    def ready(self) -> list[ProbeRow]:
        """Rows of the probes that have finished and were not handed out yet (never waits)."""
        rows = []
        while self._futures and self._futures[0].done():
            rows.append(self._futures.pop(0).result())
        return rows

    def finish(self) -> list[ProbeRow]:
        """Every row not handed out yet, the running probe's included (waited for)."""
        rows = [future.result() for future in self._futures]
        self._futures = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return rows

    def abandon(self) -> None:
        """The run failed: the probes' rows are not wanted (a running probe ends with the process)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures = []

    def _row(self, bilm: BiLM, step: int) -> ProbeRow:
        started = time.perf_counter()
        found = probe_model(bilm, self.sample)
        pos, wsd = found["pos"], found["wsd"]
        row = {
            "kind": "probe",
            "step": step,
            **{f"probe/pos_layer{k}" if k != "mix" else "probe/pos_mix": v for k, v in pos["layers"].items()},
            **{f"probe/wsd_layer{k}": v for k, v in wsd["layers"].items()},
            "probe/pos_baseline": pos["baseline"],
            "probe/wsd_baseline": wsd["baseline"],
            "probe/pos_train_tokens": pos["train"],
            "probe/pos_test_tokens": pos["test"],
            "probe/wsd_examples": wsd["test"],
        }
        result = {"probes": found}
        table, chart = report.table_rows(result), report.plot(result)
        return ProbeRow({**row, "probe/seconds": time.perf_counter() - started}, table, chart)

"""The probe stage as a `Stage` (``pipeline/stage.py``): its work (``runner.run_probe``: one process,
no Ray), what it puts on the dashboard (the table, a row per probe and a column per layer, and the
chart; as the summary each probe's best layer and accuracy, the random control's, the seconds; the
model read and the report written) and its closing lines (the table, where the report is)."""

from __future__ import annotations

from pipeline.config import to_dict
from pipeline.probe import report
from pipeline.probe.config import ProbeConfig
from pipeline.probe.runner import ProbeDetails, run_probe
from pipeline.runtime import storage
from pipeline.stage import Stage, StageContext, StageResult
from pipeline.tracking.artifacts import OutputArtifact, artifact_name, model_artifact
from pipeline.tracking.stage_run import StageLog


class ProbeStage(Stage[ProbeConfig, ProbeDetails]):
    name = "probe"
    schema = ProbeConfig

    def session(self, cfg: ProbeConfig) -> None:
        return None  # one process: no Ray

    def run(self, cfg: ProbeConfig, ctx: StageContext) -> StageResult[ProbeDetails]:
        return run_probe(cfg)

    def tracking_folder(self, cfg: ProbeConfig) -> str | None:
        return cfg.output.rstrip("/")

    def dashboard(self, cfg: ProbeConfig, result: StageResult[ProbeDetails]) -> StageLog:
        png = storage.read_bytes(storage.join(result.output, report.PLOT_FILE))
        return probe_log(cfg, result.details.report, png)

    def summary(self, cfg: ProbeConfig, result: StageResult[ProbeDetails]) -> str:
        return "\n".join(
            [
                report.table(result.details.report),
                f"probe done in {result.seconds:.0f} s: {', '.join(result.details.written)}",
            ]
        )


PROBE = ProbeStage()


def probe_log(config: ProbeConfig, result: dict, png: bytes) -> StageLog:
    """The ``probe`` run of a probe ``result`` (``png``: its chart): the table and the chart, and as
    the summary each probe's best layer and accuracy, the random control's, and the seconds."""
    summary: dict = {"seconds": result["seconds"]}
    for label, found in report.runs(result):
        prefix = "" if label == "model" else "control/"
        for name in report.TASKS:
            layers = {k: v for k, v in found[name]["layers"].items() if k != "mix" and v is not None}
            best = max(layers, key=layers.get)
            summary[f"{prefix}{name}/best_layer"] = int(best)
            summary[f"{prefix}{name}/best_accuracy"] = layers[best]
            summary[f"{prefix}{name}/baseline"] = found[name]["baseline"]
    model = result["model"]
    output = config.output.rstrip("/")
    return StageLog(
        "probe",
        to_dict(config),
        summary,
        tables={"probe/table": report.table_rows(result)},
        images={"probe/plot": png},
        uses=(model_artifact(model["options_file"], model["weights_file"]),),
        produces=OutputArtifact(
            artifact_name(output),
            "probe-report",
            checked=(storage.join(output, report.JSON_FILE), storage.join(output, report.PLOT_FILE)),
        ),
    )

"""The train stage as a `Stage` (``pipeline/stage.py``): its work (``launch.run_training``, checked
by ``prepare_run`` before a cluster starts) and its closing lines. Its dashboard is the run's own,
logged as it goes by rank 0 (``wandb_run.py``), so the stage logs nothing once done."""

from __future__ import annotations

from pipeline.stage import Stage, StageContext, StageResult
from pipeline.train.config import TrainConfig
from pipeline.train.launch import TrainDetails, prepare_run, run_training
from pipeline.train.progress import baselines_text


class TrainStage(Stage[TrainConfig, TrainDetails]):
    name = "train"
    schema = TrainConfig

    def run(self, cfg: TrainConfig, ctx: StageContext) -> StageResult[TrainDetails]:
        return run_training(cfg, prepare_run(cfg), ctx.session)  # bad input fails before Ray starts

    def summary(self, cfg: TrainConfig, result: StageResult[TrainDetails]) -> str:
        """The end-of-run held-out perplexities and where the run is."""
        final = result.details.final
        return (
            f"trained to step {final.get('step')}: held-out perplexity {final['eval/perplexity']:.2f} "
            f"(fwd {final['eval/perplexity_fwd']:.2f}, bwd {final['eval/perplexity_bwd']:.2f}; "
            f"{baselines_text(final)}); run directory {result.output}"
        )


TRAIN = TrainStage()

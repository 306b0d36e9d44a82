"""The stage seam: the stages found by name, each sizing its own Ray session, and `run_alone` /
`run_stage` running any `Stage` the same way (a stage of this test's own, so no Ray starts)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pipeline.config import load_config
from pipeline.stage import STAGES, Stage, StageContext, StageResult, run_alone, schema_named, stage_named
from pipeline.tracking.config import WandbConfig, WandbMode
from pipeline.tracking.stage_run import StageLog


def test_every_stage_is_found_by_its_name_with_its_schema():
    assert STAGES == ("shard", "train", "embed", "probe")
    for name in STAGES:
        stage = stage_named(name)
        assert stage.name == name and stage.schema is schema_named(name)
        assert schema_named(name).__name__ == f"{name.capitalize()}Config"


def test_each_stage_sizes_the_session_an_entry_point_gives_it():
    def session(name: str, *overrides: str):
        required = {"shard": ["input=[a.txt]", "output=o"], "train": ["shards=s", "output=o"],
                    "embed": ["input=[a.txt]", "output=o"], "probe": ["model=m", "output=o"]}  # fmt: skip
        cfg = load_config(schema_named(name), overrides=[*required[name], *overrides])
        return stage_named(name).session(cfg)

    shard, embed, train = (
        session("shard", "workers=3"),
        session("embed", "num_cpus=5"),
        session("train", "ray_address=auto"),
    )
    assert (shard.address, shard.num_cpus) == (None, 3)
    assert (embed.address, embed.num_cpus) == (None, 5)
    assert (train.address, train.num_cpus) == ("auto", None)
    assert session("probe") is None  # one process
    assert shard._context is None and embed._context is None  # sizing a session starts nothing


@dataclass
class _Config:
    output: str
    wandb: WandbConfig = field(default_factory=lambda: WandbConfig(mode=WandbMode.offline))


@dataclass(frozen=True)
class _Details:
    words: int


class _Counting(Stage[_Config, _Details]):
    """A stage that counts the words of one sentence: no Ray, a dashboard, closing lines."""

    name = "count"
    schema = _Config
    ran_with: list[StageContext] = []

    def session(self, cfg: _Config) -> None:
        return None

    def run(self, cfg: _Config, ctx: StageContext) -> StageResult[_Details]:
        self.ran_with.append(ctx)
        return StageResult(self.name, cfg.output, 2.0, 6, _Details(len("the cat sat on the mat".split())))

    def dashboard(self, cfg: _Config, result: StageResult[_Details]) -> StageLog:
        return StageLog(self.name, {}, {"words": result.details.words})

    def summary(self, cfg: _Config, result: StageResult[_Details]) -> str:
        return f"counted {result.details.words} words at {result.tokens_per_second:.0f} tokens/s"


def test_a_stage_runs_alone_with_its_dashboard_and_the_command_that_uploads_it(tmp_path, capsys):
    result = run_alone(_Counting(), _Config(str(tmp_path / "out")))
    assert result.details == _Details(6) and result.tokens_per_second == 3.0
    assert result.wandb_sync and result.wandb_sync.startswith("wandb sync --id ")
    (ctx,) = _Counting.ran_with
    assert ctx.session.join_only and ctx.tracking is not None  # no session of its own: it asked for none
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "counted 6 words at 3 tokens/s",
        f"  wandb: offline; upload it with: {result.wandb_sync}",
    ]
    assert (tmp_path / "out" / "wandb" / "attempt-001").is_dir()


def test_a_stage_result_is_typed_by_its_stage():
    from pipeline.embed.runner import EmbedDetails
    from pipeline.probe.runner import ProbeDetails
    from pipeline.shard.job import ShardDetails
    from pipeline.train.launch import TrainDetails

    for details in (ShardDetails, TrainDetails, EmbedDetails, ProbeDetails):
        assert details.__dataclass_params__.frozen, details
    with pytest.raises(AttributeError):
        ShardDetails({}).manifest = {}  # frozen: a later stage reads it, never writes it

"""The dashboard picture: a group's lineage read back from its runs' offline files."""

from __future__ import annotations

from offline_runs import log_stage_run

from pipeline.tools.dashboard_picture import draw, lineage, read_stage
from pipeline.tracking.artifacts import OutputArtifact
from pipeline.tracking.config import WandbConfig
from pipeline.tracking.stage_run import StageLog


def test_the_lineage_reads_runs_to_what_they_logged_and_artifacts_to_the_runs_that_used_them(tmp_path):
    root = tmp_path / "demo"
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "manifest.json").write_text("{}")
    dataset = OutputArtifact("demo-shards", "dataset", checked=(str(root / "shards" / "manifest.json"),))
    settings = WandbConfig(group="demo")
    log_stage_run(
        settings, str(root / "shards"), StageLog("shard", {}, {"train/tokens": 5}, produces=dataset)
    )
    log_stage_run(
        settings, str(root / "embeddings"), StageLog("embed", {}, {"output/tokens": 5}, uses=(dataset,))
    )
    stages = [read_stage(root / name) for name in ("shards", "embeddings")]
    assert [s.job_type for s in stages] == ["shard", "embed"] and stages[0].summary["train/tokens"] == 5
    nodes, edges = lineage(stages)
    assert nodes == {
        "shard run": ("run", 0),
        "demo-shards\n(dataset)": ("artifact", 1),
        "embed run": ("run", 4),
    }
    assert edges == {("shard run", "demo-shards\n(dataset)"), ("demo-shards\n(dataset)", "embed run")}
    assert read_stage(root / "train") is None  # no run logged there
    draw(root, tmp_path / "picture.png")
    assert (tmp_path / "picture.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

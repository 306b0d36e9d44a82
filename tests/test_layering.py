"""docs/architecture.md's layering rules, held by the code's own imports (read with ``ast``): a
newcomer learns what a module may import from a red test, not from a review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline.stage import STAGES

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {("train", "probe")}
"""Stage pairs the docs allow: train's live probe is the probe stage's (docs/architecture.md)."""


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def violations(folder: str, forbidden) -> list[str]:
    """``file: module`` for each import under ``folder`` that ``forbidden(module)`` refuses."""
    return [
        f"{path.relative_to(REPO)}: {module}"
        for path in ([REPO / folder] if folder.endswith(".py") else sorted((REPO / folder).rglob("*.py")))
        for module in sorted(imports(path))
        if forbidden(module)
    ]


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_imports_another_or_a_tool(stage):
    others = [f"pipeline.{s}" for s in STAGES if s != stage and (stage, s) not in ALLOWED]
    banned = (*others, "pipeline.end_to_end", "pipeline.tools", "jobs")
    assert violations(f"pipeline/{stage}", lambda m: under(m, *banned)) == []


BASE_MODULES = tuple(sorted(p.relative_to(REPO).as_posix() for p in (REPO / "pipeline").glob("*.py")))
"""The base's root modules (``pipeline/config.py``, ``stage.py``, ``model_loader.py`` ...): every
stage may import them, so they import none."""


def test_the_shared_floors_know_no_stage():
    banned = (*(f"pipeline.{s}" for s in STAGES), "pipeline.end_to_end", "pipeline.tools", "jobs")
    floors = ("pipeline/runtime", "pipeline/formats", "pipeline/tracking", *BASE_MODULES)
    assert "pipeline/stage.py" in floors and "pipeline/model_loader.py" in floors
    for folder in floors:
        assert violations(folder, lambda m: under(m, *banned)) == [], folder


@pytest.mark.parametrize("floor", ["pipeline/runtime", "pipeline/formats"])
def test_the_lowest_floors_know_no_tracking(floor):
    """Storage, Ray and the file formats are below the dashboard: ``tracking`` reads them, never
    the other way round (docs/architecture.md)."""
    assert violations(floor, lambda m: under(m, "pipeline.tracking")) == []


FRONT_DOORS = ("stage", "config")
"""What the entry points and the pipeline job may import of a stage: its `Stage` and its config."""


@pytest.mark.parametrize("folder", ["pipeline/end_to_end", "jobs"])
def test_a_stage_is_run_through_its_front_door(folder):
    """``jobs/`` and ``end_to_end`` run a stage by its ``stage.py`` (``run_stage``) and read its
    config; ``elmo export`` is train's export, not a stage."""
    doors = tuple(f"pipeline.{s}.{door}" for s in STAGES for door in FRONT_DOORS)
    inside = lambda m: under(m, *(f"pipeline.{s}" for s in STAGES)) and not under(m, *doors)  # noqa: E731
    found = violations(folder, inside)
    assert [v for v in found if v != "jobs/export.py: pipeline.train.export.export_checkpoint"] == []


def test_elmo_model_is_pure_pytorch():
    assert violations("elmo_model", lambda m: under(m, "pipeline", "jobs", "ray", "boto3", "omegaconf")) == []

"""pipeline.end_to_end.config: the keys that tie the stages together."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError, resolve_config
from pipeline.end_to_end.config import PipelineConfig


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "a\\b", "/abs"])
def test_a_run_name_is_one_folder_name(name):
    with pytest.raises(ConfigError) as err:
        resolve_config(PipelineConfig, overrides=[f"name={name}"], allow_missing=True)
    assert (
        str(err.value)
        == f"config key 'name' must be one folder name (no '/', '\\', '.' or '..'), got {name!r}"
    )


def test_ordinary_names_are_kept():
    for name in ("demo", "run-2026.11", "kjv_small", "..x"):
        assert resolve_config(PipelineConfig, overrides=[f"name={name}"], allow_missing=True).name == name

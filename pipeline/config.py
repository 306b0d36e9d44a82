"""Typed configs: dataclass schema -> preset YAML -> config file -> ``key=value`` overrides.

Every stage declares its config as a dataclass (``pipeline/<stage>/config.py``) whose fields each
carry a docstring. OmegaConf merges the layers in struct mode, so a key that the schema does not
declare is an error; we catch that error and rewrite it as one line that names the key and the
nearest valid keys, because OmegaConf's own message is several lines of internals.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, StringNode
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"
"""Preset YAML files (``configs/<name>.yaml``) shipped at the repository root."""

STAGES = {
    "shard": "pipeline.shard.config:ShardConfig",
    "train": "pipeline.train.config:TrainConfig",
    "embed": "pipeline.embed.config:EmbedConfig",
    "pipeline": "pipeline.pipeline_config:PipelineConfig",
}
"""Stage name -> ``module:Class`` of its schema, imported lazily so that ``elmo config shard``
does not import torch or Ray."""


class ConfigError(ValueError):
    """A config that cannot be loaded; the message is one line naming the key or file."""


def stage_schema(stage: str) -> type:
    """The schema dataclass of a stage name (``shard``, ``train``, ``embed``, ``pipeline``)."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    module_name, class_name = STAGES[stage].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def preset_names() -> list[str]:
    """Names of the presets in ``configs/`` (``tiny``, ``small``, ...)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """Path of preset ``name``; a ConfigError listing the known presets when it does not exist."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return path


def valid_keys(schema: Any, prefix: str = "") -> list[str]:
    """All dotted leaf and section keys of a schema dataclass (or instance), e.g. ``model.lstm.dim``."""
    keys = []
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        keys.append(key)
        default = _field_default(field)
        if dataclasses.is_dataclass(default):
            keys.extend(valid_keys(default, key + "."))
    return keys


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _unknown_key_error(schema: type, key: str, source: str) -> ConfigError:
    keys = valid_keys(schema)
    near = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    if not near:
        # a misspelled section name: compare the last component against every leaf name
        leaf = key.rsplit(".", 1)[-1]
        near = [k for k in keys if difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1]], cutoff=0.75)][:3]
    hint = f"; did you mean {' or '.join(repr(k) for k in near)}?" if near else ""
    return ConfigError(f"unknown config key {key!r} in {source}{hint}")


def _bad_value_error(err: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or "?"
    msg = str(err).splitlines()[0]
    return ConfigError(f"bad value for config key {key!r} in {source}: {msg}")


def _merge(base: DictConfig, layer: Any, schema: type, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, layer)
    except ConfigKeyError as err:
        return _raise(_unknown_key_error(schema, _full_key(err), source))
    except (ValidationError, OmegaConfBaseException) as err:
        if "not in struct" in str(err) or "Key '" in str(err) and "not in" in str(err):
            return _raise(_unknown_key_error(schema, _full_key(err), source))
        return _raise(_bad_value_error(err, source))


def _full_key(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or getattr(err, "key", None)
    return str(key) if key is not None else "?"


def _raise(err: Exception):
    raise err from None


def _load_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:  # report the first line only
        raise ConfigError(f"cannot parse config file {path}: {str(err).splitlines()[0]}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not a {type(data).__name__}")
    return OmegaConf.create(data)


def _parse_overrides(overrides: Iterable[str]) -> DictConfig:
    items = list(overrides)
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value")
    try:
        return OmegaConf.from_dotlist(items)
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot parse overrides {items}: {str(err).splitlines()[0]}") from None


def load_config(
    schema: type,
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    preset: str | None = None,
    allow_missing: bool = False,
) -> DictConfig:
    """Resolve a stage config.

    Merge order: ``schema`` defaults, then ``configs/<preset>.yaml``, then ``config_file``, then
    ``overrides`` (``["train.workers=2", ...]``). Returns a read-only, typed OmegaConf DictConfig
    (attribute access, values validated against the dataclass types). Raises ConfigError, also for
    a required key left without a value unless ``allow_missing`` (for printing, or for a caller
    that derives those keys itself).
    """
    cfg = OmegaConf.structured(schema)
    OmegaConf.set_struct(cfg, True)
    if preset:
        layer = _select_preset(_load_yaml(preset_path(preset)), schema, preset)
        cfg = _merge(cfg, layer, schema, f"preset {preset!r}")
    if config_file:
        cfg = _merge(cfg, _load_yaml(config_file), schema, str(config_file))
    if overrides:
        cfg = _merge(cfg, _parse_overrides(overrides), schema, "command-line overrides")
    _spell_booleans_as_typed(cfg)
    if not allow_missing:
        check_complete(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _spell_booleans_as_typed(cfg: DictConfig) -> None:
    """YAML (files and ``key=value``) reads ``use_gpu=true`` as a boolean, which a string field then
    stores as ``'True'``; string fields get back the lowercase spelling the user typed."""
    for key in cfg:
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            _spell_booleans_as_typed(node)
        elif isinstance(node, StringNode) and node._value() in ("True", "False"):
            cfg[key] = node._value().lower()


def check_complete(cfg: DictConfig) -> None:
    """ConfigError naming the first required key that still has no value."""
    try:
        OmegaConf.to_container(cfg, throw_on_missing=True)
    except OmegaConfBaseException as err:
        key = _full_key(err)
        raise ConfigError(f"config key {key!r} has no value; set it with {key}=...") from None


def _select_preset(preset: DictConfig, schema: type, name: str) -> DictConfig:
    """A preset is a partial train config (model size and recipe). A schema says where it goes with
    a ``PRESET_SECTION`` class attribute: ``""`` for the train config itself, ``"train"`` for the
    whole-pipeline config; schemas without it take no preset."""
    section = getattr(schema, "PRESET_SECTION", None)
    if section is None:
        raise ConfigError(
            f"preset {name!r} given, but this stage takes no preset (presets are model sizes for train/pipeline)"
        )
    return OmegaConf.create({section: preset}) if section else preset


def to_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML (what ``elmo config STAGE`` prints)."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(cfg: DictConfig) -> dict:
    """The resolved config as plain Python containers (for JSON manifests and wandb)."""
    return OmegaConf.to_container(cfg, resolve=True)


def require_at_least(
    cfg: DictConfig, keys: Iterable[str], minimum: int = 1, error: type[Exception] = ConfigError
) -> None:
    """Range check that the types alone cannot express: each (dotted) key's value >= ``minimum``."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value < minimum:
            raise error(f"config key {key!r} must be >= {minimum}, got {value}")


def require_choice(
    cfg: DictConfig, key: str, allowed: Iterable[str], error: type[Exception] = ConfigError
) -> None:
    """The (dotted) key's value must be one of ``allowed``; the error lists them."""
    allowed = tuple(allowed)
    value = str(OmegaConf.select(cfg, key))
    if value not in allowed:
        raise error(f"config key {key!r} must be one of {', '.join(allowed)}, got {value!r}")

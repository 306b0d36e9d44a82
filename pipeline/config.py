"""Typed configs: dataclass schema -> preset YAML -> config file -> ``key=value`` overrides.

Every stage declares its config as a dataclass (``pipeline/<stage>/config.py``) whose fields each
carry a docstring; choices are ``Enum`` fields and each range rule is checked once, in the
dataclass's ``__post_init__``. OmegaConf merges the layers in struct mode, so a key that the schema
does not declare is an error; we catch that error and rewrite it as one line that names the key and
the nearest valid keys, because OmegaConf's own message is several lines of internals. The result
is converted with ``OmegaConf.to_object``: code reads typed fields of real dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import typing
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from omegaconf import BooleanNode, DictConfig, EnumNode, ListConfig, OmegaConf, StringNode, grammar_parser
from omegaconf.errors import ConfigKeyError, GrammarParseError, OmegaConfBaseException, ValidationError
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser

from pipeline.errors import PipelineError
from pipeline.runtime.redaction import redact_values

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

T = TypeVar("T")

PRESETS = resources.files("pipeline") / "presets"
"""Preset YAML files (``pipeline/presets/<name>.yaml``): package data, read through importlib.resources
so that an installed wheel finds them wherever it is installed."""


class ConfigError(PipelineError, ValueError):
    """A config that cannot be loaded; the message is one line naming the key or file."""


class UseGPU(enum.Enum):
    """Whether a stage's workers use GPUs."""

    auto = "auto"
    """When the Ray cluster has them."""
    true = "true"
    """Always (an error when the cluster has too few)."""
    false = "false"
    """Never."""


def choices(kind: type[enum.Enum]) -> list[str]:
    """The spellings of an Enum config field's values (``["auto", "true", "false"]``)."""
    return [member.name for member in kind]


def check_rules(rules: Iterable[tuple[str, Any, bool, str]]) -> None:
    """The range rules of a config: ``(key, value, ok, what the value must be)``; a ConfigError
    names the first key whose rule fails. Called from the schemas' ``__post_init__``, so a rule is
    checked once, wherever the config comes from; values still unset (``???``) are not checked."""
    for key, value, ok, expected in rules:
        if value != "???" and not ok:
            raise ConfigError(f"config key {key!r} must be {expected}, got {value!r}")


def seed_rule(seed: int) -> tuple[str, Any, bool, str]:
    """The rule of a ``seed`` key: a non-negative 64-bit signed integer, which torch and numpy take
    (a larger one would start the run and fail inside it)."""
    return ("seed", seed, 0 <= seed < 2**63, "in [0, 2**63 - 1]")


def preset_names() -> list[str]:
    """Names of the presets in ``pipeline/presets/`` (``tiny``, ``small``, ...)."""
    return sorted(
        p.name.removesuffix(".yaml") for p in PRESETS.iterdir() if p.name.endswith(".yaml") and p.is_file()
    )


def preset_path(name: str) -> Traversable:
    """The package resource of preset ``name`` (a ``Path`` when the package is installed as files);
    a ConfigError listing the known presets when it does not exist."""
    if name not in preset_names():  # a name, never a path (``../x`` would read a file elsewhere)
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return PRESETS / f"{name}.yaml"


def preset_layers(preset: str) -> list[tuple[str, DictConfig]]:
    """The preset files a ``--preset`` names, in merge order, as (name, contents): a model size
    alone (``small``), or a size and a recipe after it (``original,bilm-tf``: the later file's keys
    win). A size is a preset with a ``model`` section; a ConfigError refuses two sizes, a recipe
    without a size or before it, and a preset named twice."""
    layers = [(name, _read_preset(name)) for name in (part.strip() for part in preset.split(","))]
    names = [name for name, _ in layers]
    sizes = [name for name, contents in layers if "model" in contents]
    if sizes != names[:1] or len(set(names)) != len(names):
        known = ", ".join(n for n in preset_names() if "model" in _read_preset(n))
        raise ConfigError(
            f"--preset {preset!r} must name one model size first, then recipes only (e.g. "
            f"'original,bilm-tf'); the sizes: {known}"
        )
    return layers


def _read_preset(name: str) -> DictConfig:
    with resources.as_file(preset_path(name)) as path:  # a real file even from a zipped package
        return _load_yaml(path)


def preset_section(name: str, section: str) -> DictConfig:
    """One section (``model``, ...) of preset ``name`` (its files merged), as the files hold it."""
    merged = OmegaConf.merge(
        *(layer.get(section) or OmegaConf.create({}) for _, layer in preset_layers(name))
    )
    return merged if isinstance(merged, DictConfig) else OmegaConf.create({})


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


def resolver_calls(text: str) -> list[str]:
    """The resolver calls in ``text`` as OmegaConf's own grammar reads a value (``${oc.env:X}``,
    one after an escaped backslash, a name built from another key as in ``${${k}:X}`` or
    ``${oc.${k}:X}``, one nested inside a key reference): each call's resolver name as written.
    Text the grammar cannot parse is never resolved, so it calls nothing."""
    if "${" not in text:
        return []
    try:
        tree = grammar_parser.parse(text)
    except GrammarParseError:
        return []
    calls, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            calls.append(node.resolverName().getText())
        todo.extend(node.getChildren() if hasattr(node, "getChildren") else ())
    return calls


def _refuse_resolvers(layer: Any, source: str, prefix: str = "") -> None:
    """ConfigError naming the first key of ``layer`` whose value (or name) calls a resolver. Every
    resolver is refused: a config is recorded (run.json, metrics.jsonl, checkpoints, wandb, the
    console), so a value read from the environment would put a secret there; secrets reach boto3
    and wandb from the environment directly. References to other keys (``${train.name}``) stay."""
    if isinstance(layer, DictConfig | dict):
        items = layer.items_ex(resolve=False) if isinstance(layer, DictConfig) else layer.items()
        for key, value in items:
            _refuse_resolvers(str(key), source, f"{prefix}{key}")  # a key's own name too
            _refuse_resolvers(value, source, f"{prefix}{key}.")
    elif isinstance(layer, ListConfig | list):
        for index, value in enumerate(
            layer._iter_ex(resolve=False) if isinstance(layer, ListConfig) else layer
        ):
            _refuse_resolvers(value, source, f"{prefix}{index}.")
    elif isinstance(layer, str) and (calls := resolver_calls(layer)):
        raise ConfigError(
            f"config key {prefix.rstrip('.')!r} in {source} calls the resolver {calls[0]!r} "
            f"(${{{calls[0]}:...}}): configs are recorded in run.json, metrics and wandb, so values "
            "may not be read from the environment or other resolvers; secrets such as AWS or wandb keys "
            "are read from the environment by boto3 and wandb themselves"
        )


def _merge(base: DictConfig, layer: Any, schema: type, source: str) -> DictConfig:
    _refuse_resolvers(layer, source)
    _spell_booleans_as_typed(base, layer)
    try:
        return OmegaConf.merge(base, layer)
    except ConfigKeyError as err:
        return _raise(_unknown_key_error(schema, _full_key(err), source))
    except (ValidationError, OmegaConfBaseException) as err:
        if "not in struct" in str(err) or "Key '" in str(err) and "not in" in str(err):
            return _raise(_unknown_key_error(schema, _full_key(err), source))
        key = _full_key(err)
        current = OmegaConf.select(base, key, default=None)
        if isinstance(current, enum.Enum):  # a choice: the same one line as every range rule
            names = ", ".join(choices(type(current)))
            return _raise(ConfigError(f"config key {key!r} must be one of {names}, got {err.value!r}"))
        return _raise(_bad_value_error(err, source))


def _full_key(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or getattr(err, "key", None)
    return str(key) if key is not None else "?"


def _raise(err: Exception):
    raise err from None


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: a few lines of nested aliases expand to billions of nodes (an "alias
    bomb" that hangs the reader and fills memory), and a config file has no need for them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(
                f"line {mark.line + 1}: YAML aliases (*name) are not allowed in config files"
            )
        return super().compose_node(parent, index)


def _load_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as err:  # report the first line only
        raise ConfigError(f"cannot parse config file {path}: {str(err).splitlines()[0]}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not a {type(data).__name__}")
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as err:  # a YAML type a config has no use for (!!set, !!binary, ...)
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(
            f"config file {path}: key {key!r} holds a YAML {_value_at(data, str(key))}, which a config "
            "cannot hold (numbers, strings, booleans, lists and mappings only)"
        ) from None


def _value_at(data: Any, key: str) -> str:
    """The type name of ``data``'s value at the dotted ``key`` (list items by index)."""
    for part in key.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.lstrip("[").rstrip("]").isdigit():
            data = data[int(part.lstrip("[").rstrip("]"))]
    return type(data).__name__


def _parse_overrides(overrides: Iterable[str]) -> DictConfig:
    """``key=value`` items, each value read as YAML (``[a,b]`` a list, ``2`` a number), one item at a
    time so that a value YAML cannot read is a ConfigError naming its key."""
    parsed = OmegaConf.create({})
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            # ``key=`` is the empty string (documented for time_budget, wandb.entity), not YAML's null
            layer = _flag_layer({key: ""}) if value == "" else OmegaConf.from_dotlist([item])
            parsed = OmegaConf.merge(parsed, layer)
        except (OmegaConfBaseException, yaml.YAMLError) as err:
            first = str(err).strip().splitlines()[0]
            raise ConfigError(
                f"cannot read the value of config key {key!r} ({value!r}): {first}; quote a literal "
                f"string in YAML, e.g. {key}=\"'{value}'\""
            ) from None
    return parsed


def _flag_layer(flags: Mapping[str, Any]) -> DictConfig:
    """Flag values as the entry point parsed them (``--output 1.10`` the string ``"1.10"``), keyed
    by their dotted config keys: no YAML reads them, so a path is the path typed."""
    layer = OmegaConf.create({})
    for key, value in flags.items():
        OmegaConf.update(
            layer, key, list(value) if isinstance(value, list | tuple) else value, force_add=True
        )
    return layer


def resolve_config(
    schema: type,
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    preset: str | None = None,
    allow_missing: bool = False,
    flags: Mapping[str, Any] | None = None,
) -> DictConfig:
    """The merged config as an OmegaConf node (for printing, or for a caller that derives keys).

    Merge order: ``schema`` defaults, then ``pipeline/presets/<preset>.yaml`` (each of a
    comma-separated list, see `preset_layers`), then ``config_file``, then ``flags`` (an entry
    point's flags: ``{"output": "1.10"}``, values taken as they are, never read as YAML), then
    ``overrides`` (``["train.workers=2", ...]``, each value read as YAML). Values are validated
    against the dataclass types and choices. Raises ConfigError, also for a required key left
    without a value unless ``allow_missing``.
    """
    cfg = OmegaConf.structured(schema)
    OmegaConf.set_struct(cfg, True)
    for name, contents in preset_layers(preset) if preset else ():
        cfg = _merge(cfg, _select_preset(contents, schema, name), schema, f"preset {name!r}")
    if config_file:
        cfg = _merge(cfg, _load_yaml(config_file), schema, str(config_file))
    if flags:
        cfg = _merge(cfg, _flag_layer(flags), schema, "command-line flags")
    if overrides:
        cfg = _merge(cfg, _parse_overrides(overrides), schema, "command-line overrides")
    if not allow_missing:
        check_complete(cfg)
    check_values(cfg, schema)
    return cfg


def check_values(cfg: DictConfig, schema: type) -> None:
    """Run the schema's range rules (its ``__post_init__``) on ``cfg``, unset keys included: what
    ``elmo config`` prints is what a stage would accept. Unset keys (``???``) pass every rule; an
    interpolation that cannot be resolved (``${no.such.key}``) is a ConfigError naming it."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as err:
        raise ConfigError(
            f"config key {_full_key(err)!r}: cannot resolve its interpolation ({str(err).splitlines()[0]})"
        ) from None
    _instantiate(schema, data)


def _instantiate(schema: type, data: dict) -> Any:
    """``schema(**data)`` with nested dataclass fields built the same way (``OmegaConf.to_object``
    would refuse unset keys)."""
    hints = typing.get_type_hints(schema)
    kwargs = {}
    for f in dataclasses.fields(schema):
        if not f.init or f.name not in data:
            continue
        value, kind = data[f.name], hints[f.name]
        kwargs[f.name] = (
            _instantiate(kind, value) if dataclasses.is_dataclass(kind) and isinstance(value, dict) else value
        )
    return schema(**kwargs)


def load_config(
    schema: type[T],
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    preset: str | None = None,
    flags: Mapping[str, Any] | None = None,
) -> T:
    """Resolve a stage config (see `resolve_config`) into an instance of the ``schema`` dataclass,
    its range rules checked. Raises ConfigError (one line naming the key)."""
    return to_object(resolve_config(schema, config_file, overrides, preset, flags=flags))


def to_object(cfg: DictConfig) -> Any:
    """A complete config node as its dataclass instance (``OmegaConf.to_object``)."""
    check_complete(cfg)
    return OmegaConf.to_object(cfg)


def _spell_booleans_as_typed(base: DictConfig, layer: Any, prefix: str = "") -> None:
    """YAML (files and ``key=value``) reads ``use_gpu=true`` as a boolean, which a string or choice
    field cannot hold; such fields get the lowercase spelling the user typed. The other way round,
    OmegaConf takes any number for a boolean (``dedup=2`` is true); a boolean field takes ``true``,
    ``false``, ``0`` or ``1`` and a ConfigError names any other number."""
    if not isinstance(layer, DictConfig):
        return
    for key in list(layer.keys()):
        if key not in base:
            continue
        target = base._get_node(key)
        value = layer._get_node(key)
        if isinstance(target, DictConfig):
            _spell_booleans_as_typed(target, value, f"{prefix}{key}.")
        elif OmegaConf.is_interpolation(layer, key):
            continue
        elif isinstance(target, StringNode | EnumNode) and isinstance(layer[key], bool):
            layer[key] = str(layer[key]).lower()
        elif (
            isinstance(target, BooleanNode)
            and isinstance(layer[key], int | float)
            and not isinstance(layer[key], bool)
            and layer[key] not in (0, 1)
        ):
            raise ConfigError(f"config key '{prefix}{key}' is true or false, got {layer[key]!r}")


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


def _node(cfg: Any) -> DictConfig:
    return cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)


def to_yaml(cfg: Any) -> str:
    """A config (node or dataclass instance) as YAML (what ``elmo config STAGE`` prints)."""
    return OmegaConf.to_yaml(_node(cfg), resolve=True)


def to_dict(cfg: Any) -> dict:
    """A config (node or dataclass instance) as plain Python containers, choices by name, credentials
    in URLs redacted (for JSON manifests, metrics, checkpoints and wandb)."""
    return redact_values(OmegaConf.to_container(_node(cfg), resolve=True, enum_to_str=True))

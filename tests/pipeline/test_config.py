"""pipeline.config: merge order, typed values, one-line errors with suggestions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from jobs.stages import stage_schema
from pipeline.config import (
    ConfigError,
    UseGPU,
    load_config,
    preset_names,
    resolve_config,
    resolver_calls,
    to_dict,
    to_object,
    to_yaml,
    valid_keys,
)
from pipeline.model_config import ModelConfig, to_options


@dataclass
class _Inner:
    lr: float = 0.2
    """learning rate"""
    kind: str = "adagrad"
    """optimizer"""


@dataclass
class _Schema:
    PRESET_SECTION: ClassVar[str] = ""
    workers: int = 1
    """number of workers"""
    name: str = "run"
    """run name"""
    optim: _Inner = field(default_factory=_Inner)
    """optimizer"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """model"""


def test_defaults_then_file_then_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("workers: 3\nname: from-file\n")
    cfg = load_config(_Schema, config_file=cfg_file, overrides=["workers=5", "optim.lr=0.1"])
    assert (cfg.workers, cfg.name, cfg.optim.lr) == (5, "from-file", 0.1)


def test_preset_sits_between_schema_and_file(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("model:\n  lstm:\n    dim: 99\n")
    cfg = resolve_config(stage_schema("train"), config_file=cfg_file, preset="small", allow_missing=True)
    assert cfg.model.lstm.projection_dim == 128  # from the preset
    assert cfg.model.lstm.dim == 99  # the file wins over the preset


def test_misspelled_key_names_it_and_suggests(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_Schema, overrides=["wokrers=2"])
    message = str(err.value)
    assert "\n" not in message
    assert "'wokrers'" in message and "'workers'" in message


def test_misspelled_nested_key_in_file(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("model:\n  lstm:\n    projection_dmi: 8\n")
    with pytest.raises(ConfigError, match=r"model\.lstm\.projection_dmi.*model\.lstm\.projection_dim"):
        load_config(_Schema, config_file=cfg_file)


def test_wrong_type_is_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(_Schema, overrides=["workers=many"])
    assert "workers" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["workers", "=3"])
def test_malformed_override(bad):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(_Schema, overrides=[bad])


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(_Schema, config_file=tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: [1, 2\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(_Schema, config_file=bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_Schema, config_file=scalar)


@pytest.mark.timeout(20)
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    # 9 levels of 9-way aliases: 9**9 (387 million) leaves once expanded
    levels = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nworkers: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(_Schema, config_file=bomb)
    assert (
        str(err.value)
        == f"cannot parse config file {bomb}: line 2: YAML aliases (*name) are not allowed in config files"
    )
    plain = tmp_path / "anchor.yaml"
    plain.write_text("workers: &w 2\n")  # an anchor alone expands nothing
    assert load_config(_Schema, config_file=plain).workers == 2


def test_pipeline_takes_presets_under_its_train_section():
    cfg = resolve_config(stage_schema("pipeline"), preset="small", allow_missing=True)
    assert cfg.train.model.lstm.dim == 1024


def test_stages_without_presets_refuse_one():
    with pytest.raises(ConfigError, match="takes no preset"):
        resolve_config(stage_schema("embed"), preset="small", allow_missing=True)


def test_missing_required_key_is_named():
    with pytest.raises(ConfigError, match="'shards' has no value"):
        load_config(stage_schema("train"))


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match="tiny"):
        load_config(_Schema, preset="huge")


def test_presets_are_the_released_sizes():
    assert {"tiny", "small", "medium", "original"} <= set(preset_names())
    for name, (dim, proj, highway) in {
        "small": (1024, 128, 1),
        "medium": (2048, 256, 1),
        "original": (4096, 512, 2),
    }.items():
        options = to_options(
            to_object(resolve_config(stage_schema("train"), preset=name, allow_missing=True).model)
        )
        assert (options["lstm"]["dim"], options["lstm"]["projection_dim"]) == (dim, proj)
        assert options["char_cnn"]["n_highway"] == highway
        assert sum(n for _, n in options["char_cnn"]["filters"]) == 2048
        assert options["char_cnn"]["n_characters"] == 262


def test_resolved_config_is_the_schema_dataclass_and_serialisable():
    cfg = load_config(_Schema)
    assert isinstance(cfg, _Schema) and isinstance(cfg.optim, _Inner) and cfg.workers == 1
    assert "workers: 1" in to_yaml(cfg)
    assert to_dict(cfg)["optim"] == {"lr": 0.2, "kind": "adagrad"}


def test_valid_keys_are_dotted():
    keys = valid_keys(_Schema)
    assert "optim.lr" in keys and "model.lstm.cell_clip" in keys


def test_boolean_words_keep_their_spelling_in_string_fields(tmp_path):
    """`use_gpu=false` (read by YAML as a boolean) is the choice 'false'; a string field keeps 'true'."""
    from pipeline.embed.config import EmbedConfig

    cfg = resolve_config(EmbedConfig, overrides=["use_gpu=false"], allow_missing=True)
    assert cfg.use_gpu is UseGPU.false
    path = tmp_path / "c.yaml"
    path.write_text("name: true\nworkers: 3\n")
    cfg = load_config(_Schema, config_file=path)
    assert cfg.name == "true" and cfg.workers == 3
    assert load_config(_Schema, overrides=["name=Truely"]).name == "Truely"


@pytest.mark.parametrize(
    ("where", "value"),
    [("file", "p-${oc.env:ELMO_TEST_SECRET}"), ("override", "n-${ oc.env :ELMO_TEST_SECRET}")],
)
def test_a_value_read_from_the_environment_is_refused_in_one_line(tmp_path, monkeypatch, where, value):
    """A config is recorded (run.json, metrics, checkpoints, wandb): ${oc.env:...} would copy a
    secret there, or, unset, fail with OmegaConf's traceback. Refused before anything resolves it."""
    monkeypatch.setenv("ELMO_TEST_SECRET", "hunter2")
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"optim:\n  lr: 0.2\nname: '{value}'\n" if where == "file" else "workers: 2\n")
    overrides = [f"name={value}"] if where == "override" else []
    with pytest.raises(ConfigError) as err:
        load_config(_Schema, config_file=cfg_file, overrides=overrides)
    message = str(err.value)
    assert "config key 'name'" in message and "calls the resolver 'oc.env'" in message
    assert "hunter2" not in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"config key 'optim.lr' in .*calls the resolver 'oc.decode'"):
        load_config(_Schema, overrides=["optim.lr=${oc.decode:'0.5'}"])


GRAMMAR_FORMS = [
    ("name", "\\\\${oc.env:ELMO_TEST_SECRET}", "oc.env"),  # an escaped backslash, then a live call
    ("name", "${${optim.kind}:ELMO_TEST_SECRET}", "${optim.kind}"),  # the resolver's name from a key
    ("name", "${oc.${optim.kind}:ELMO_TEST_SECRET}", "oc.${optim.kind}"),
    ("name", "${optim.${oc.env:ELMO_TEST_SECRET}}", "oc.env"),  # nested inside a key reference
    ("name", "a ${b:${oc.env:ELMO_TEST_SECRET}} c", "b"),  # any resolver, nested calls too
    ("name", "'${oc.env:ELMO_TEST_SECRET}'", "oc.env"),  # quoted
    ("model.char_cnn.filters", "[[1, '${oc.env:ELMO_TEST_SECRET}']]", "oc.env"),  # in a list
]


@pytest.mark.parametrize("where", ["override", "file"])
@pytest.mark.parametrize(("key", "value", "resolver"), GRAMMAR_FORMS)
def test_every_resolver_call_the_grammar_allows_is_refused(
    tmp_path, monkeypatch, where, key, value, resolver
):
    """The refusal reads a value as OmegaConf's own grammar does, not as text: each form here
    resolved the secret past the earlier pattern match (or would)."""
    monkeypatch.setenv("ELMO_TEST_SECRET", "hunter2")
    overrides = ["optim.kind=oc.env"]
    cfg_file = tmp_path / "c.yaml"
    if where == "override":
        overrides.append(f"{key}={value}")
        cfg_file.write_text("workers: 2\n")
    else:
        section, _, leaf = key.rpartition(".")
        indent = (
            "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split("."))) if section else ""
        )
        depth = len(section.split(".")) if section else 0
        cfg_file.write_text(indent + f"{'  ' * depth}{leaf}: {yaml_quoted(value)}\n")
    with pytest.raises(ConfigError) as err:
        load_config(_Schema, config_file=cfg_file, overrides=overrides)
    message = str(err.value)
    assert f"calls the resolver {resolver!r}" in message, message
    assert "hunter2" not in message and "\n" not in message


def yaml_quoted(value: str) -> str:
    """``value`` as one YAML scalar of exactly that text (a list stays a flow list)."""
    return value if value.startswith("[") else "'" + value.replace("'", "''") + "'"


def test_a_resolver_call_in_a_keys_name_is_refused(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("optim:\n  ${oc.env:ELMO_TEST_SECRET}: 1\n")
    with pytest.raises(
        ConfigError, match=r"config key 'optim.\$\{oc.env:ELMO_TEST_SECRET\}' .*calls the resolver 'oc.env'"
    ):
        load_config(_Schema, config_file=cfg_file)


def test_text_that_only_looks_like_a_call_is_kept():
    assert resolver_calls("\\${oc.env:X}") == []  # escaped: the text ${oc.env:X}
    assert resolver_calls("${train.name}") == [] and resolver_calls("plain: text") == []
    assert resolver_calls("${oc.env:X") == []  # never parsed, so never resolved
    assert load_config(_Schema, overrides=["name=\\${oc.env:X}"]).name == "${oc.env:X}"


def test_a_reference_to_another_key_resolves_and_a_dangling_one_is_one_line():
    assert load_config(_Schema, overrides=["name=run-${workers}", "workers=4"]).name == "run-4"
    assert load_config(_Schema, overrides=["name=\\${oc.env:X}"]).name == "${oc.env:X}"  # escaped: text
    with pytest.raises(ConfigError, match=r"config key 'name': cannot resolve its interpolation"):
        load_config(_Schema, overrides=["name=${no.such.key}"])


@pytest.mark.parametrize(
    ("text", "key", "kind"),
    [("name: !!set {a, b}\n", "name", "set"), ("optim:\n  kind: !!set {x}\n", "optim.kind", "set")],
)
def test_a_yaml_type_no_config_holds_is_one_line(tmp_path, text, key, kind):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(_Schema, config_file=cfg_file)
    assert str(err.value) == (
        f"config file {cfg_file}: key {key!r} holds a YAML {kind}, which a config cannot hold (numbers, "
        "strings, booleans, lists and mappings only)"
    )


def test_a_number_is_not_a_boolean(tmp_path):
    """OmegaConf alone reads `dedup=2` as true; a boolean key takes true/false or 0/1, nothing else,
    in a file, an override or a nested section."""
    from pipeline.end_to_end.config import PipelineConfig
    from pipeline.shard.config import ShardConfig

    required = ["input=[x]", "output=y"]
    assert load_config(ShardConfig, overrides=[*required, "dedup=0"]).dedup is False
    assert load_config(ShardConfig, overrides=[*required, "dedup=1"]).dedup is True
    assert load_config(ShardConfig, overrides=[*required, "dedup=off"]).dedup is False
    for value in ("2", "-1", "0.5"):
        with pytest.raises(ConfigError, match=rf"config key 'dedup' is true or false, got {value}$"):
            load_config(ShardConfig, overrides=[*required, f"dedup={value}"])
    path = tmp_path / "c.yaml"
    path.write_text("shard:\n  lowercase: 7\n")
    with pytest.raises(ConfigError, match=r"config key 'shard.lowercase' is true or false, got 7$"):
        resolve_config(PipelineConfig, config_file=path, allow_missing=True)

"""options.json parsing (docs/weights.md#optionsjson)."""

from __future__ import annotations

import copy
import json

import pytest
from elmo_reference import TINY_OPTIONS

from elmo_model import BiLMOptions, OptionsError


def test_reference_options_parse(reference):
    options = BiLMOptions.from_file(reference.options_file)
    assert options.n_filters == 124 and options.n_highway == 2 and options.n_layers == 2
    assert options.cell_clip == 3.0 and options.proj_clip == 3.0
    assert options.use_skip_connections is (reference.name == "allennlp")
    raw = json.loads(reference.options_file.read_text())
    assert BiLMOptions.from_dict(options.to_dict()) == options
    assert options.to_dict()["char_cnn"]["filters"] == raw["char_cnn"]["filters"]


def test_training_form_defaults_and_extra_keys():
    raw = copy.deepcopy(TINY_OPTIONS)
    raw["char_cnn"]["n_characters"] = 261
    del raw["char_cnn"]["n_highway"], raw["lstm"]["cell_clip"], raw["lstm"]["use_skip_connections"]
    raw.update(dropout=0.1, n_epochs=10, bidirectional=True)
    options = BiLMOptions.from_dict(raw)
    assert options.n_highway == 0 and options.cell_clip is None and not options.use_skip_connections
    assert options.dropout == 0.1 and options.extra == {"n_epochs": 10, "bidirectional": True}
    written = options.to_dict()
    assert written["char_cnn"]["n_characters"] == 262
    assert set(written["lstm"]) == {
        "dim",
        "projection_dim",
        "n_layers",
        "cell_clip",
        "proj_clip",
        "use_skip_connections",
    }
    assert written["lstm"]["cell_clip"] is None


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("char_cnn", "activation", "sigmoid", "char_cnn.activation"),
        ("char_cnn", "max_characters_per_token", 40, "char_cnn.max_characters_per_token"),
        ("char_cnn", "n_characters", 300, "char_cnn.n_characters"),
        ("char_cnn", "filters", [[1, 4], [0, 2]], r"char_cnn.filters\[1\]"),
        ("char_cnn", "filters", [], "char_cnn.filters"),
        ("char_cnn", "n_highway", -1, "char_cnn.n_highway"),
        ("char_cnn", "embedding", {"dim": 0}, "char_cnn.embedding.dim"),
        ("lstm", "projection_dim", 12, "lstm.projection_dim"),
        ("lstm", "dim", "64", "lstm.dim"),
        ("lstm", "cell_clip", -1, "lstm.cell_clip"),
        ("lstm", "use_skip_connections", "yes", "lstm.use_skip_connections"),
        ("lstm", "n_layer", 2, "lstm.n_layer"),
    ],
)
def test_bad_values_name_the_key(section, key, value, message):
    _refused(section, key, value, message)


def _refused(section: str, key: str, value, message: str) -> None:
    """TINY_OPTIONS with ``section.key`` set to ``value`` is refused with ``message``."""
    raw = copy.deepcopy(TINY_OPTIONS)
    raw[section][key] = value
    with pytest.raises(OptionsError, match=message):
        BiLMOptions.from_dict(raw)


def test_missing_keys_and_sections():
    raw = copy.deepcopy(TINY_OPTIONS)
    del raw["lstm"]["dim"]
    with pytest.raises(OptionsError, match="missing required key 'lstm.dim'"):
        BiLMOptions.from_dict(raw)
    with pytest.raises(OptionsError, match="'char_cnn'.*word-input"):
        BiLMOptions.from_dict({"lstm": TINY_OPTIONS["lstm"]})
    with pytest.raises(OptionsError, match="'dropout'"):
        BiLMOptions.from_dict({**TINY_OPTIONS, "dropout": 1.5})


def test_unreadable_file_names_the_file(tmp_path):
    bad = tmp_path / "options.json"
    bad.write_text("{not json")
    with pytest.raises(OptionsError, match="options.json: cannot read options JSON"):
        BiLMOptions.from_file(bad)
    bad.write_text(json.dumps({"lstm": {}, "char_cnn": {}}))
    with pytest.raises(OptionsError, match=r"options.json: .*char_cnn.activation"):
        BiLMOptions.from_file(bad)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("lstm", "dim", 10**9, r"'lstm.dim' must be an integer in \[1, 65536\], got 1000000000"),
        ("lstm", "n_layers", 10**6, r"'lstm.n_layers' must be an integer in \[1, 64\], got 1000000"),
        (
            "char_cnn",
            "filters",
            [[1, 10**9]],
            r"'char_cnn.filters\[0\]' must be \[width, count\] ints in \[1, 65536\]",
        ),
        (
            "char_cnn",
            "filters",
            [[1, 4]] * 1000,
            r"'char_cnn.filters' must be a list of 1 to 64 .*1000 entries",
        ),
        ("char_cnn", "n_highway", 10**5, r"'char_cnn.n_highway' must be an integer in \[0, 64\]"),
    ],
)
def test_absurd_sizes_are_refused_before_anything_is_allocated(section, key, value, message):
    _refused(section, key, value, message)


def test_a_model_past_the_parameter_limit_is_refused():
    raw = copy.deepcopy(TINY_OPTIONS)
    raw["lstm"].update(dim=60000, projection_dim=4096, n_layers=8)  # each size allowed, together 35B
    with pytest.raises(
        OptionsError, match=r"the model would have 35,[\d,]+ parameters \([\d.,]+ GiB in float32\)"
    ):
        BiLMOptions.from_dict(raw)

"""options.json parsing and validation (docs/weights.md#optionsjson).

`BiLMOptions.from_dict` accepts both the inference form (only `lstm` and `char_cnn`) and bilm-tf's
training form (extra top-level keys). Missing optional keys take bilm-tf's defaults; every
unsupported or malformed value raises `OptionsError` naming the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elmo_model.characters import MAX_CHARACTERS_PER_TOKEN, N_CHARACTERS, N_RAW_CHARACTERS

ACTIVATIONS = ("relu", "tanh")

_CHAR_CNN_KEYS = {
    "activation",
    "embedding",
    "filters",
    "max_characters_per_token",
    "n_characters",
    "n_highway",
}
_LSTM_KEYS = {"dim", "projection_dim", "n_layers", "cell_clip", "proj_clip", "use_skip_connections"}


class OptionsError(ValueError):
    """A malformed or unsupported options.json value; the message names the key."""


MAX_SIZE = 1 << 16
"""Largest width of any one layer (``lstm.dim``, ``lstm.projection_dim``, a filter count, the
character embedding): 64 times the original model's widest, far past any trained ELMo."""
MAX_DEPTH = 64
"""Most LSTM layers, highway layers or char CNN filters."""
MAX_PARAMETERS = 1 << 31
"""Most biLM parameters (8 GiB in float32; the original model has 93.6M): options asking for more
are refused before anything is allocated."""


def _int(
    section: dict, key: str, path: str, minimum: int = 1, default: int | None = None, maximum: int = MAX_SIZE
) -> int:
    if key not in section:
        if default is None:
            raise OptionsError(f"options: missing required key '{path}.{key}'")
        return default
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise OptionsError(
            f"options: '{path}.{key}' must be an integer in [{minimum}, {maximum}], got {value!r}"
        )
    return value


def _clip(section: dict, key: str) -> float | None:
    value = section.get(key)
    if value is None or value == 0:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise OptionsError(f"options: 'lstm.{key}' must be null, 0 or a positive number, got {value!r}")
    return float(value)


def _section(options: dict, key: str, allowed: set[str]) -> dict:
    if key not in options:
        raise OptionsError(
            f"options: missing required section '{key}'"
            + (" (word-input models without a char CNN are not supported)" if key == "char_cnn" else "")
        )
    section = options[key]
    if not isinstance(section, dict):
        raise OptionsError(f"options: '{key}' must be an object, got {type(section).__name__}")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise OptionsError(f"options: unknown key '{key}.{unknown[0]}' (known: {', '.join(sorted(allowed))})")
    return section


def _filters(char_cnn: dict) -> tuple[tuple[int, int], ...]:
    if "filters" not in char_cnn:
        raise OptionsError("options: missing required key 'char_cnn.filters'")
    raw = char_cnn["filters"]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_DEPTH:
        shown = raw if not isinstance(raw, list) or len(raw) <= MAX_DEPTH else f"{len(raw)} entries"
        raise OptionsError(
            f"options: 'char_cnn.filters' must be a list of 1 to {MAX_DEPTH} [width, count] pairs, got {shown!r}"
        )
    filters = []
    for i, entry in enumerate(raw):
        ok = (
            isinstance(entry, (list, tuple))
            and len(entry) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE for v in entry)
        )
        if not ok:
            raise OptionsError(
                f"options: 'char_cnn.filters[{i}]' must be [width, count] ints in [1, {MAX_SIZE}], got {entry!r}"
            )
        if entry[0] > MAX_CHARACTERS_PER_TOKEN:
            raise OptionsError(f"options: 'char_cnn.filters[{i}]' width {entry[0]} exceeds 50 characters")
        filters.append((int(entry[0]), int(entry[1])))
    return tuple(filters)


@dataclass(frozen=True)
class BiLMOptions:
    """The biLM architecture. Field names follow options.json (`char_embed_dim` = `char_cnn.embedding.dim`)."""

    char_embed_dim: int
    filters: tuple[tuple[int, int], ...]
    n_highway: int
    activation: str
    dim: int
    projection_dim: int
    n_layers: int
    cell_clip: float | None
    proj_clip: float | None
    use_skip_connections: bool
    dropout: float = 0.0
    """Training-time dropout (top-level `dropout` of bilm-tf training options); 0 for inference files."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Other top-level keys of a training options dict, kept as given (not used by the model)."""

    @property
    def n_filters(self) -> int:
        """F: width of the CNN output and of the highway layers."""
        return sum(n for _, n in self.filters)

    @classmethod
    def from_dict(cls, options: dict) -> BiLMOptions:
        """Parse and validate an options.json dict; raises OptionsError naming the offending key."""
        if not isinstance(options, dict):
            raise OptionsError(f"options must be a JSON object, got {type(options).__name__}")
        char_cnn = _section(options, "char_cnn", _CHAR_CNN_KEYS)
        lstm = _section(options, "lstm", _LSTM_KEYS)

        activation = char_cnn.get("activation")
        if activation not in ACTIVATIONS:
            raise OptionsError(
                f"options: 'char_cnn.activation' must be one of {ACTIVATIONS}, got {activation!r}"
            )
        embedding = char_cnn.get("embedding")
        if not isinstance(embedding, dict) or set(embedding) != {"dim"}:
            raise OptionsError(f"options: 'char_cnn.embedding' must be {{\"dim\": int}}, got {embedding!r}")
        char_embed_dim = _int(embedding, "dim", "char_cnn.embedding")
        max_chars = _int(char_cnn, "max_characters_per_token", "char_cnn")
        if max_chars != MAX_CHARACTERS_PER_TOKEN:
            raise OptionsError(f"options: 'char_cnn.max_characters_per_token' must be 50, got {max_chars}")
        n_characters = _int(char_cnn, "n_characters", "char_cnn", default=N_CHARACTERS)
        if n_characters not in (N_RAW_CHARACTERS, N_CHARACTERS):
            raise OptionsError(f"options: 'char_cnn.n_characters' must be 261 or 262, got {n_characters}")

        dim = _int(lstm, "dim", "lstm")
        projection_dim = _int(lstm, "projection_dim", "lstm")
        if projection_dim >= dim:
            raise OptionsError(
                f"options: 'lstm.projection_dim' ({projection_dim}) must be < 'lstm.dim' ({dim}); "
                "LSTMs without a projection are not supported"
            )
        skip = lstm.get("use_skip_connections", False)
        if not isinstance(skip, (bool, int)) or skip not in (0, 1):
            raise OptionsError(f"options: 'lstm.use_skip_connections' must be true or false, got {skip!r}")

        dropout = options.get("dropout", 0.0)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise OptionsError(f"options: 'dropout' must be a number in [0, 1), got {dropout!r}")
        extra = {k: v for k, v in options.items() if k not in ("lstm", "char_cnn", "dropout")}
        parsed = cls(
            char_embed_dim=char_embed_dim,
            filters=_filters(char_cnn),
            n_highway=_int(char_cnn, "n_highway", "char_cnn", minimum=0, default=0, maximum=MAX_DEPTH),
            activation=activation,
            dim=dim,
            projection_dim=projection_dim,
            n_layers=_int(lstm, "n_layers", "lstm", default=1, maximum=MAX_DEPTH),
            cell_clip=_clip(lstm, "cell_clip"),
            proj_clip=_clip(lstm, "proj_clip"),
            use_skip_connections=bool(skip),
            dropout=float(dropout),
            extra=extra,
        )
        if parsed.num_parameters > MAX_PARAMETERS:
            raise OptionsError(
                f"options: the model would have {parsed.num_parameters:,} parameters "
                f"({parsed.num_parameters * 4 / 2**30:,.1f} GiB in float32), more than the limit of "
                f"{MAX_PARAMETERS:,}; check lstm.dim, lstm.n_layers, char_cnn.filters and char_cnn.n_highway"
            )
        return parsed

    @property
    def num_parameters(self) -> int:
        """Parameters of the biLM these options describe (char CNN, highways, projection, LSTMs)."""
        d_c, width, p, c = self.char_embed_dim, self.n_filters, self.projection_dim, self.dim
        cnn = N_CHARACTERS * d_c + sum(w * d_c * n + n for w, n in self.filters)
        highway = self.n_highway * 2 * (width * width + width)
        projection = width * p + p if width != p else 0
        lstm = 2 * self.n_layers * (4 * c * 2 * p + 4 * c + c * p)
        return cnn + highway + projection + lstm

    @classmethod
    def from_file(cls, path: str | Path) -> BiLMOptions:
        """Read and validate an options.json file; errors name the file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OptionsError(f"{path}: cannot read options JSON: {exc}") from exc
        try:
            return cls.from_dict(data)
        except OptionsError as exc:
            raise OptionsError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict:
        """The inference options.json form, every key written (docs/weights.md#export, `n_characters` 262)."""
        return {
            "lstm": {
                "dim": self.dim,
                "projection_dim": self.projection_dim,
                "n_layers": self.n_layers,
                "cell_clip": self.cell_clip,
                "proj_clip": self.proj_clip,
                "use_skip_connections": self.use_skip_connections,
            },
            "char_cnn": {
                "activation": self.activation,
                "embedding": {"dim": self.char_embed_dim},
                "filters": [list(f) for f in self.filters],
                "max_characters_per_token": MAX_CHARACTERS_PER_TOKEN,
                "n_characters": N_CHARACTERS,
                "n_highway": self.n_highway,
            },
        }

"""The wandb settings every stage takes (``wandb.*``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class WandbMode(enum.Enum):
    offline = "offline"
    """The run lands in OUTPUT/wandb; ``wandb sync`` uploads it (the summary prints the command)."""
    online = "online"
    """Needs WANDB_API_KEY or ``wandb login``."""
    disabled = "disabled"
    """No wandb run."""


@dataclass
class WandbConfig:
    """Weights & Biases tracking."""

    mode: WandbMode = WandbMode.offline
    """``offline`` (default; the run lands in OUTPUT/wandb, one directory per attempt, all under the
    run's wandb id), ``online`` (needs WANDB_API_KEY or ``wandb login``) or ``disabled``."""
    project: str = "elmo-pipeline"
    """wandb project name."""
    entity: str = ""
    """wandb entity (team or user); empty uses the API key's default."""
    group: str = ""
    """wandb group the run joins (``elmo pipeline`` sets its name, so a pipeline's stages show as one
    group); empty: none."""

"""The wandb settings every stage takes (``wandb.*``)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from pipeline.config import check_rules


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

    def __post_init__(self) -> None:
        # wandb checks a project name only as its run starts (after a stage's work, or in every
        # restart of a training run), and never a group; these are its rules, checked before anything
        check_rules(
            [
                ("wandb.project", self.project, name_ok(self.project) and bool(self.project), NAME_RULE),
                ("wandb.group", self.group, name_ok(self.group), NAME_RULE + " (empty: none)"),
                (
                    "wandb.entity",
                    self.entity,
                    re.fullmatch(r"[A-Za-z0-9._-]{0,128}", self.entity) is not None,
                    "at most 128 letters, digits and . _ - (empty: the API key's default)",
                ),
            ]
        )


NAME_RULE = "at most 128 printable characters, none of / \\ # ? % : (wandb's rule for a project)"
_FORBIDDEN = set("/\\#?%:")


def name_ok(name: str) -> bool:
    """A wandb project or group name: at most 128 printable characters without ``/ \\ # ? % :``,
    and no spaces at its ends."""
    return (
        len(name) <= 128 and name.isprintable() and not _FORBIDDEN.intersection(name) and name.strip() == name
    )

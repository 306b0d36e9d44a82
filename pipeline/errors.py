"""The one error family of elmo-pipeline.

Every error this package reports to a user is a `PipelineError` whose message is one line naming
the path or key and the cause; the entry points (``jobs/``) catch this base once, print
``error: MESSAGE`` and exit 2. Each stage has its subclass (``ShardError``, ``TrainError`` with
``CheckpointError``, ``EmbedError``); ``ConfigError``, ``StorageError`` and ``FormatError`` are
shared by every stage. Errors of the model package (``elmo_model.OptionsError``, ``WeightsError``)
are turned into the stage's error where a stage reads a model.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A run that cannot start or did not finish; the message is one line naming the cause."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or ``kill`` stopping the job), raised where Ctrl-C's KeyboardInterrupt
    would be: a stage stops the same way, and the entry points report ``terminated``, exit 143."""

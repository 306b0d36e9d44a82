"""TrainError: the train stage's one error type (CheckpointError is one kind of it)."""

from pipeline.errors import PipelineError


class TrainError(PipelineError):
    """A training run that cannot start or did not finish; one line naming the cause."""

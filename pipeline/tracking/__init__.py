"""Experiment tracking (wandb), shared by every stage: the settings, where a run's offline files
live, and the run a one-shot stage logs (docs/outputs.md#the-dashboard)."""

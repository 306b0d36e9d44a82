"""elmo-pipeline's stages and the layers they share (docs/architecture.md).

Stages, none importing another: ``shard`` (corpus -> vocabulary, shards, manifest, baselines),
``train`` (biLM pretraining on Ray Train), ``embed`` (bulk embedding on Ray Data), ``probe`` (what the
layers know), and ``end_to_end`` (all four as one command, ``elmo pipeline``).

Shared below them: ``stage`` (the seam every stage implements), ``config`` (typed configs merged by
OmegaConf) and ``model_config`` (the model sizes), ``model_loader`` (a model's files found, checked and
loaded), ``output_folder`` (who owns an output, its lease), ``errors`` (the one error family),
``formats`` (the files stages hand each other), ``runtime`` (Ray, storage, child processes),
``tracking`` (wandb), ``tools`` (commands beside the stages) and ``presets``/``data`` (package data).
"""

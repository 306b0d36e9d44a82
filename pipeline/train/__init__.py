"""Stage 2: biLM pretraining on Ray Train (``elmo train`` / ``python -m jobs.train``; docs/training.md).

The driver's side, in the order a run uses it:

- ``config``: TrainConfig (every key documented; the time budget's spelling); ``errors``: TrainError;
- ``launch``: the checks and the plan (``prepare_run``, whose facts every worker reads: ``plan``), the
  run's lease and its final status; ``fit``: the Ray Train fit, its restarts and the driver's
  graceful stop; ``stage``: the stage's closing lines;
- ``run_claim``: who a run directory belongs to (``run.json``) and its driver's lease; ``run_dir``:
  every path in a run directory and how a run writes there;
- ``progress``: the console lines the driver prints from the rows rank 0 relays.

One rank's side (``trainer.train_loop_per_worker``), the loop read top to bottom in ``trainer``:

- ``step``: the model, softmax and optimizer of a rank and its training step (what ``benchmarks/``
  time); ``step_inputs``: a step's batch on the host, copied to the device; ``objective``: the
  softmax shared by both directions; ``optimization``: optimizer, schedule, clipping
  (``adagrad_kernel``: its CUDA update as a Triton kernel); ``distributed``: the collectives;
- ``data``: the batches of the original recipe from a shard directory (``sentence_source``: one
  direction's sentences for a rank; ``shard_reading``: one shard read; ``char_cache``: the
  vocabulary spelled once);
- ``run_length``: the run's length: its ceiling, the planned last step (a time budget fitted), the
  end's price and the training clock;
- ``evaluate``: held-out perplexity as bilm-tf computes it; ``divergence``: the guard;
- ``checkpoint``: checkpoints in the run directory (``snapshot``: a step's state copied without
  waiting); ``export``: the original options.json + HDF5, the softmax and the vocabulary;
- ``metrics``: the rows' sinks (metrics.jsonl, the plot; ``wandb_run``: the run's one wandb run);
  ``stop``: stopping at a step boundary when the driver is asked to.
"""

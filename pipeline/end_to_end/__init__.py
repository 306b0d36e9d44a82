"""The whole pipeline as one job (``elmo pipeline``): shard -> train -> embed -> probe, beside the
stages it runs (``job``) and its config (``config``)."""

"""Connecting to Ray: an existing cluster when one is named, else an embedded local one.

Every stage runs inside ``ray_session``. On a laptop (the embedded default) it starts a local
cluster and shuts it down afterwards; under ``ray job submit`` or with ``RAY_ADDRESS`` set it joins
the running cluster and leaves it alone, because the job does not own that cluster.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

ENV_VARS_FOR_WORKERS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "WANDB_API_KEY",
    "WANDB_MODE",
)
"""Variables copied into every Ray worker, so a worker sees the same S3 endpoint and credentials
as the driver even when the cluster was started before they were set."""


def worker_env() -> dict[str, str]:
    """The driver's storage/tracking environment variables, for ``runtime_env['env_vars']``."""
    return {k: os.environ[k] for k in ENV_VARS_FOR_WORKERS if k in os.environ}


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Run the body with Ray initialised.

    ``address``: a cluster address (``auto``, ``ray://...``, ``host:port``); default ``RAY_ADDRESS``.
    ``num_cpus``: CPUs of an embedded cluster (default: all of this machine's).
    Joins an already-initialised Ray untouched (tests start one per session).
    """
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs = {"runtime_env": {"env_vars": worker_env()}, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
    # Library components (Ray Train's controller, for one) look the cluster up again by address;
    # with several Ray clusters on one machine that lookup is ambiguous unless RAY_ADDRESS names ours.
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    try:
        yield
    finally:
        ray.shutdown()
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous

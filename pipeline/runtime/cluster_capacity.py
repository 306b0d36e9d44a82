"""Whether the Ray cluster holds what a stage's workers need, and getting it from an autoscaler.

A stage knows its need before it starts workers: one resource bundle per worker (``{"GPU": 1,
"CPU": 1}`` x 4, say). If the cluster holds it now, nothing happens. An embedded cluster never
grows, so a shortfall there is a clear error at once. A joined cluster may autoscale: the stage asks
the autoscaler for the bundles (``ray.autoscaler.sdk.request_resources``) and waits for them, a line
on the console saying so, up to ``timeout_s``. It stops waiting with the same clear error when the
autoscaler's node types can never hold the need (autoscaler v2 publishes that maximum), or when no
node is on its way ``probe_s`` after the request (no autoscaler, or one that cannot help: a plain
fixed cluster). The request is withdrawn when the wait ends, so it never keeps nodes up by itself.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from pipeline.runtime.background import in_thread

QUERY_TIMEOUT_S = 60.0
"""How long a question to the cluster (its resources) may take before the stage gives up."""
PROBE_S = 30.0
"""How long after asking the autoscaler a first node must be on its way (or have arrived)."""
POLL_S = 2.0


class CapacityError(Exception):
    """The cluster cannot hold the workers (the stage re-raises it as its own error)."""


@dataclass(frozen=True)
class Need:
    """``bundles``: one resource dict per worker; ``what``: the settings that make the need
    (``workers=4 x threads_per_worker=2``); ``hint``: what to change when it cannot be met."""

    bundles: tuple[dict[str, float], ...]
    what: str
    hint: str

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                out[name] = out.get(name, 0.0) + amount
        return out


def shortfall(need: dict[str, float], have: dict[str, float]) -> dict[str, tuple[float, float]]:
    """``{resource: (needed, had)}`` for every resource ``have`` holds less of than ``need``."""
    return {
        name: (amount, have.get(name, 0.0)) for name, amount in need.items() if amount > have.get(name, 0.0)
    }


def _describe(need: Need, have: dict[str, float]) -> str:
    parts = [
        f"{n:g} {name}s but the Ray cluster has {h:g}"
        for name, (n, h) in shortfall(need.total(), have).items()
    ]
    return f"{need.what} need {' and '.join(parts)}; {need.hint}"


def cluster_resources() -> dict[str, float]:
    """``ray.cluster_resources()``, asked on a helper thread: a GCS query has no timeout of its own."""
    import ray

    try:
        return in_thread(ray.cluster_resources, "cluster-resources").result(timeout=QUERY_TIMEOUT_S)
    except FutureTimeout:
        raise CapacityError(
            f"the Ray cluster did not report its resources within {QUERY_TIMEOUT_S:g} s"
        ) from None


def gpus_to_be_had(embedded: bool) -> float:
    """GPUs the cluster has, or (a joined cluster) the most its autoscaler may grow it to."""
    have = cluster_resources().get("GPU", 0.0)
    if embedded:
        return have
    return max(have, (autoscaler_maximum() or {}).get("GPU", 0.0))


def autoscaler_maximum() -> dict[str, float] | None:
    """The most of each resource the autoscaler may grow the cluster to (autoscaler v2 publishes
    it with its node types); None where none is published (autoscaler v1, or no autoscaler)."""
    try:
        from ray._private.state import state

        return state.get_max_resources_from_cluster_config()
    except Exception:  # noqa: BLE001 - an internal API: without it the probe decides
        return None


def nodes_on_the_way() -> bool:
    """Whether the autoscaler reports nodes pending or being launched (its status in the GCS)."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        report = json.loads(raw)["autoscaler_report"] if raw else {}
    except Exception:  # noqa: BLE001 - an internal status: without it only arrivals count
        return False
    return bool(report.get("pending_nodes") or report.get("pending_launches"))


def _request(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def secure(
    need: Need,
    embedded: bool,
    timeout_s: float,
    *,
    probe_s: float | None = None,
    say: Callable[[str], None] = _say,
) -> dict[str, float]:
    """Return the cluster's resources once they hold ``need``; a CapacityError naming the
    shortfall when they cannot (module docstring). ``embedded``: the stage started the cluster."""
    probe_s = PROBE_S if probe_s is None else probe_s
    have = cluster_resources()
    if not shortfall(need.total(), have):
        return have
    if embedded:
        raise CapacityError(_describe(need, have))
    most = autoscaler_maximum()
    if most is not None and shortfall(need.total(), most):
        limit = ", ".join(f"{most.get(name, 0):g} {name}s" for name in shortfall(need.total(), most))
        raise CapacityError(f"{_describe(need, have)} (its autoscaler can grow it to {limit} at most)")
    missing = ", ".join(f"{n - h:g} more {name}s" for name, (n, h) in shortfall(need.total(), have).items())
    say(f"waiting up to {timeout_s:g} s for the Ray autoscaler to add {missing} for {need.what}")
    _request(list(need.bundles))
    start = time.monotonic()
    try:
        while True:
            time.sleep(POLL_S)
            now = cluster_resources()
            if not shortfall(need.total(), now):
                say(f"the Ray cluster has the resources after {time.monotonic() - start:.0f} s")
                return now
            waited = time.monotonic() - start
            grew = any(now.get(name, 0.0) > have.get(name, 0.0) for name in need.total())
            if most is None and waited > probe_s and not grew and not nodes_on_the_way():
                raise CapacityError(
                    f"{_describe(need, now)} (no node was on its way {probe_s:g} s after asking "
                    "the Ray autoscaler: the cluster does not grow)"
                )
            if waited > timeout_s:
                raise CapacityError(
                    f"{_describe(need, now)} (the Ray autoscaler did not add it within {timeout_s:g} s)"
                )
    finally:
        _request([])  # withdrawn: the workers hold the nodes from here on

"""Who a run directory belongs to: the claim in its ``run.json`` (the run's name, wandb id and the
data it trains on), checked before a run resumes there, and the lease its driver holds while it
trains (``pipeline/output_folder.py``)."""

from __future__ import annotations

import json

from pipeline.formats.shard_manifest import ShardManifest
from pipeline.output_folder import Lease, check_owned, read_marker
from pipeline.runtime import storage
from pipeline.tracking.offline_files import new_wandb_id
from pipeline.train.config import run_name_ok
from pipeline.train.errors import TrainError
from pipeline.train.run_dir import OWN_FILES, RunDir


def data_identity(manifest: ShardManifest) -> dict:
    """What a run trains on, as recorded in its ``run.json``: the vocabulary's sha256 and one sha256
    over the manifest's shard lists (names, counts and each shard's sha256), so the same shards
    copied elsewhere are the same data and a re-shard with another vocabulary or corpus is not."""
    return {
        "vocab_sha256": manifest.vocab.sha256,
        "shards_sha256": manifest.listing_sha256,
        "vocab_size": manifest.vocab.size,
        "shards": manifest.folder,
    }


def check_same_data(run_dir: str, recorded: dict, data: dict) -> None:
    """A resume must train on the data the run started on (``init_from`` is for new data)."""
    keys = ("vocab_sha256", "shards_sha256")
    if all(recorded.get(k) == data[k] for k in keys):
        return
    what = "vocabulary" if recorded.get("vocab_sha256") != data["vocab_sha256"] else "shard set"

    def named(d: dict) -> str:
        return (
            f"{d.get('shards')} (vocabulary {str(d.get('vocab_sha256'))[:12]}..., {d.get('vocab_size')} words; "
            f"shards {str(d.get('shards_sha256'))[:12]}...)"
        )

    raise TrainError(
        f"run directory {run_dir} was trained on {named(recorded)}, not on {named(data)}: "
        f"a resume on another {what} is refused; use another output, or init_from={run_dir}/export to continue on new data"
    )


def run_lease(run_dir: str) -> Lease:
    """The lease a driver holds on its run directory while it trains there."""
    return Lease(run_dir, TrainError, "run directory")


def claim_run_dir(run_dir: str, name: str, data: dict) -> str:
    """Claim ``run_dir`` for run ``name`` trained on ``data`` (``run.json``), or check that it is
    this run's, on the same data; returns the run's wandb id, made at the first claim (a run
    claimed before ids or data were recorded gets them now)."""
    path = RunDir(run_dir).run_file
    claim = {}
    if check_owned(run_dir, OWN_FILES, TrainError):
        claim = read_marker(run_dir, OWN_FILES, TrainError)
        owner = claim.get("name")
        if not isinstance(owner, str) or not owner or not run_name_ok(owner):
            raise TrainError(
                f"{path} names no run ({owner!r}): it is damaged; restore it from a copy, or choose another output"
            )
        if owner != name:
            raise TrainError(
                f"run directory {run_dir} belongs to run {owner!r}; use name={owner} to resume it or another output"
            )
        if claim.get("data"):
            check_same_data(run_dir, claim["data"], data)
        if claim.get("wandb_id") and claim.get("data"):
            return claim["wandb_id"]
    claim = {"name": name, "wandb_id": claim.get("wandb_id") or new_wandb_id(), "data": data}
    storage.write_bytes(path, json.dumps(claim).encode())
    return claim["wandb_id"]

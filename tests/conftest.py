"""Shared fixtures: a real S3 server (SeaweedFS) and an embedded Ray cluster, each started once.

Both are lazy: a test session that asks for neither starts neither. ``ray_local`` depends on
``s3_server`` so Ray starts after the AWS_* variables are set; its workers inherit them (and a
made-up ``WANDB_API_KEY``, so tests can look for it in logs) from the driver's environment, as the
workers of any embedded cluster do; no secret goes into a runtime_env. While it runs,
``RAY_ADDRESS`` names it, so Ray's state API (and any ``elmo`` subprocess) finds this cluster even
when other Ray clusters run on the same machine.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass

import pytest

from pipeline.runtime import storage
from pipeline.tools.local_s3 import REGION, LocalS3Server

TEST_BUCKET = "elmo-test"
AWS_VARS_CLEARED = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")
"""Ambient variables that would change which credentials or retries the tests use."""
FAKE_WANDB_KEY = "elmofake" + "0123456789abcdef" * 2
"""A 40-character stand-in for a wandb key, set while ``ray_local`` runs (wandb stays offline)."""


TIER_FIXTURES = {
    "cluster": ("ray_local", "ray_temp_dir"),
    "s3": ("s3_server", "s3_prefix"),
}
"""Tiers marked from the fixtures a test asks for (``make test-fast`` leaves these out, with the
``subprocess`` and ``slow`` tests, which their modules mark)."""


SIDE_STREAM = ("tests/infra/test_packaging.py",)
"""Modules that ``make test`` runs beside all the others (pytest-xdist, two workers, ``--dist
loadscope``: `pytest_xdist_make_scheduler`). They build and install the wheel and run the README's
commands, each in a subprocess with a Ray cluster of its own: minutes of it, nothing timed.
Everything else keeps one worker and its order: the session's own Ray cluster and S3 server serve
one test at a time, and the tests that time a stop (tests/pipeline/runtime, late in that order) come
after the side stream's few minutes are over."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadscope``: two scopes, `SIDE_STREAM` and the rest, one worker each."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoStreams(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "side" if nodeid.split("::", 1)[0] in SIDE_STREAM else "main"

    return TwoStreams(config, log)


def pytest_collection_modifyitems(config, items):
    """Each test gets the ``cluster`` or ``s3`` marker when it uses the session's Ray cluster or S3
    server. Tests marked ``cuda`` are skipped without a CUDA device: CI has none, a GPU session runs
    them (``pytest -m cuda``, from benchmarks/gpu_train_session.sh)."""
    import torch

    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in TIER_FIXTURES.items():
            if used.intersection(fixtures):
                item.add_marker(getattr(pytest.mark, marker))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run in GPU sessions: pytest -m cuda)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def single_thread():
    """One torch thread: the test models are tiny, and one thread avoids stalls when other processes
    share the cores."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@dataclass(frozen=True)
class ShortPipeline:
    """A short whole ``elmo pipeline --preset tiny`` run: the first ``lines`` lines of a corpus
    (`corpus_slice`), and ``overrides`` (key=value) for 12 training steps, one checkpoint, a few
    held-out batches, small embedding shards and no progress bars."""

    lines: int
    overrides: tuple[str, ...]

    def corpus_slice(self, corpus_gz) -> str:
        """The run's corpus: the first ``lines`` lines of the gzipped text file ``corpus_gz``."""
        with gzip.open(corpus_gz, "rt", encoding="utf-8") as src:
            return "".join(itertools.islice(src, self.lines))


@pytest.fixture(scope="session")
def short_pipeline() -> ShortPipeline:
    return ShortPipeline(
        lines=3000,
        overrides=(
            "shard.heldout_fraction=0.05",
            "shard.progress=false",
            "train.max_steps=12",
            "train.eval_every=0",
            "train.checkpoint_every=12",
            "train.log_every=4",
            "train.eval_max_batches=5",
            "embed.progress=false",
            "embed.lines_per_shard=100",
            "probe.pos_train_sentences=200",
            "probe.pos_test_sentences=100",
            "probe.wsd_examples=300",
            "probe.threads=1",
        ),
    )


@dataclass(frozen=True)
class S3Server:
    """What tests need to know about the session's S3 server."""

    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str
    server: LocalS3Server

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _set_env(values: dict[str, str | None]) -> dict[str, str | None]:
    """Apply ``values`` (None unsets) to os.environ; return what was there before."""
    previous = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return previous


@pytest.fixture(scope="session", autouse=True)
def home_state_in_tmp(tmp_path_factory):
    """Keep what matplotlib, wandb and Ray would write under ``~`` out of it, so a test run leaves
    no files outside tmp: their caches go to the session's tmp dir, and Ray's token authentication,
    on by default for a new local cluster (it then writes ``~/.ray/auth_token``), is off for the
    loopback-only test cluster. (A token in the environment does not work here: Ray reads the mode
    into its native config at import, before this fixture runs.)"""
    root = tmp_path_factory.mktemp("home-state")
    names = {
        "MPLCONFIGDIR": "matplotlib",
        "WANDB_CONFIG_DIR": "wandb-config",
        "WANDB_CACHE_DIR": "wandb-cache",
        "WANDB_DATA_DIR": "wandb-data",
    }
    values = {name: str(root / sub) for name, sub in names.items()}
    values["RAY_AUTH_MODE"] = "disabled"
    # every temporary file of this process and its children (wandb's service and media folders,
    # CLI subprocesses) inside the session's tmp dir, which pytest removes at the end
    scratch = root / "tmp"
    scratch.mkdir()
    values["TMPDIR"] = str(scratch)
    previous, previous_tempdir = _set_env(values), tempfile.tempdir
    tempfile.tempdir = str(scratch)
    yield root
    tempfile.tempdir = previous_tempdir
    _set_env(previous)


@pytest.fixture(scope="session")
def kenlm():
    """KenLM built from the registry's source (pipeline/tools/kenlm_build.py), cached between runs
    in ~/.cache/elmo-pipeline (the one thing a test run keeps outside tmp, as pip keeps its cache):
    about 90 s the first time; skipped with the reason where it cannot be built."""
    from pipeline.tools.kenlm_build import KenLMUnavailable, find_or_build

    try:
        return find_or_build()
    except KenLMUnavailable as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS S3 server on free loopback ports with one bucket; AWS_* env set for the session."""
    with LocalS3Server(tmp_path_factory.mktemp("s3server")) as server:
        server.create_bucket(TEST_BUCKET)
        env = {
            "AWS_ENDPOINT_URL": server.endpoint_url,
            "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            **dict.fromkeys(AWS_VARS_CLEARED),
        }
        previous = _set_env(env)
        storage.configure()
        try:
            yield S3Server(server.endpoint_url, TEST_BUCKET, server.access_key, server.secret_key, server)
        finally:
            _set_env(previous)
            storage.configure()


@pytest.fixture
def s3_prefix(s3_server, request) -> str:
    """A fresh ``s3://bucket/<test name>-<random>/`` prefix for one test."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", request.node.name)[:60]
    return s3_server.url(f"{name}-{secrets.token_hex(4)}/")


@pytest.fixture(scope="session")
def fake_wandb_key() -> str:
    """The made-up WANDB_API_KEY the embedded cluster's processes see (tests look for it in logs)."""
    return FAKE_WANDB_KEY


@pytest.fixture(scope="session")
def ray_temp_dir():
    """The embedded Ray cluster's temp dir (its session logs live under it); removed at the end."""
    # short: Ray's unix socket paths live under it and must stay within ~107 characters
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    yield temp_dir
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_local(s3_server, ray_temp_dir):
    """An embedded 2-CPU Ray cluster for the session (started after the S3 environment is set)."""
    import ray

    if ray.is_initialized():
        raise RuntimeError("ray_local: Ray is already initialised by something else in this session")
    # its processes' temporary files go where this session's do (TMPDIR: home_state_in_tmp)
    wandb_key = _set_env({"WANDB_API_KEY": FAKE_WANDB_KEY})
    ray.init(
        num_cpus=2,
        # as an embedded cluster of the stages: the State API (dashboard) lets Ray Train's
        # placement-group cleaner see its controller end, and the secrets test searches its logs too
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=_free_port(),
        object_store_memory=512 * 1024 * 1024,
        _temp_dir=ray_temp_dir,
        configure_logging=True,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    # other Ray clusters may run on this machine: state APIs and subprocesses must find this one
    previous = _set_env({"RAY_ADDRESS": ray.get_runtime_context().gcs_address})
    try:
        yield ray
    finally:
        _set_env(previous)
        ray.shutdown()
        _set_env(wandb_key)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 2 MiB tmpfs mounted under ``tmp_path`` (a full disk for real: writes fail with ENOSPC);
    skipped where mounting is not allowed (it needs root). Unmounted after the test."""
    mount = tmp_path / "small-fs"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)

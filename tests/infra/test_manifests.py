"""infra/ and the README: every manifest parses, and every entry point and config key named there exists.

Each ``python -m jobs.<stage> ...`` command found in a manifest (RayJob entrypoints, and the usage
lines of the cluster-launcher file), and each stage command shown in the README, is parsed by that
stage's own argument parser and resolved against its config schema, so a renamed flag or config
key breaks this test, not a cluster job or a newcomer's first command.

The Ray version is pinned once, in pyproject.toml's ``cluster`` extra; the Dockerfile's base image,
the RayJobs' ``rayVersion`` and every image tag in infra/ must name that same version.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shlex
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

from jobs.stage_args import flag_values, parse_stage_args
from jobs.stages import stage_schema
from pipeline.config import resolve_config, to_object

INFRA = Path(__file__).resolve().parents[2] / "infra"
REPO = INFRA.parent
MANIFESTS = sorted(INFRA.glob("*.yaml"))
SECRET_NAME = re.compile(r"(SECRET|KEY|TOKEN|PASSWORD)", re.IGNORECASE)
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGE_REPOSITORY = "ghcr.io/elmo-pipeline/elmo-pipeline"
BASE_IMAGE = re.compile(
    r"^FROM rayproject/ray:(?P<ray>[0-9.]+)-py(?P<py>3)(?P<minor>[0-9]+)-(?:gpu|cu[0-9]+)\s*$", re.M
)
"""The official Ray image, GPU flavour: ``rayproject/ray:<ray version>-py3XX-gpu`` (or ``-cuXXX``)."""


def _ray_pin() -> str:
    """The one exact Ray version: the ``ray==X`` requirement of the ``cluster`` extra."""
    pins = [Requirement(r) for r in PROJECT["optional-dependencies"]["cluster"]]
    (pin,) = [r for r in pins if r.name == "ray"]
    (spec,) = pin.specifier
    assert spec.operator == "==", f"the cluster extra must pin ray exactly, not {pin}"
    return spec.version


def _image_tag() -> str:
    """The tag every manifest runs: ``<project version>-ray<pinned Ray version>``."""
    return f"{IMAGE_REPOSITORY}:{PROJECT['version']}-ray{_ray_pin()}"


def _job_commands(text: str) -> list[list[str]]:
    """Every ``python -m jobs.X ...`` command in a file, comment continuation lines joined."""
    joined = re.sub(r"\\\n#?\s*", " ", text)
    commands = []
    for match in re.finditer(r"python -m jobs\.[a-z_]+[^\n]*", joined):
        commands.append(shlex.split(match.group(0)))
    return commands


def _readme_commands() -> list[list[str]]:
    """The README's stage commands (inline code spans), as ``python -m jobs.X`` argument lists.
    Optional parts in ``[...]`` are kept without their brackets; ``...`` elisions are dropped."""
    text = (REPO / "README.md").read_text()
    commands = []
    for span in re.findall(r"`([^`\n]+)`", text):
        match = re.search(r"(?:^elmo |python -m jobs\.)(shard|train|embed|pipeline)\b(.*)$", span)
        if match and "<" not in span:
            rest = match.group(2).replace("[", " ").replace("]", " ").replace("...", " ")
            commands.append(["python", "-m", f"jobs.{match.group(1)}", *shlex.split(rest)])
    return commands


def _entrypoints(doc: dict) -> list[list[str]]:
    return [shlex.split(doc["spec"]["entrypoint"])] if doc.get("kind") == "RayJob" else []


def _check_command(argv: list[str], complete: bool = True) -> None:
    """Parse and resolve one stage command; ``complete=False`` allows required keys left out
    (a README snippet that elides the paths with ``...``)."""
    assert argv[:2] == ["python", "-m"], argv
    stage = argv[2].removeprefix("jobs.")
    module = importlib.import_module(argv[2])
    args = parse_stage_args(module.build_parser(), argv[3:])
    cfg = resolve_config(
        stage_schema(stage),
        args.config,
        list(args.overrides),
        preset=getattr(args, "preset", None),
        allow_missing=True,
        flags=flag_values(args, getattr(module, "FLAGS", {})),
    )
    if complete:  # every required key given: the typed config, its range rules checked
        assert to_object(cfg) is not None


def _containers(doc: dict) -> list[dict]:
    cluster = doc["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_there_are_manifests_for_pretraining_embedding_and_a_cluster():
    names = {p.name for p in MANIFESTS}
    assert {"rayjob-pretrain.yaml", "rayjob-embed.yaml", "cluster-gpu.yaml"} <= names
    assert (INFRA / "Dockerfile").is_file() and (INFRA / "local-s3.sh").is_file()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_commands_name_real_entry_points_and_keys(path):
    text = path.read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    commands = [c for d in docs for c in _entrypoints(d)] or _job_commands(text)
    assert commands, f"{path.name} names no job entry point"
    for argv in commands:
        _check_command(argv)


def test_readme_stage_commands_name_real_flags_and_keys():
    commands = _readme_commands()
    assert {c[2] for c in commands} == {"jobs.shard", "jobs.train", "jobs.embed", "jobs.pipeline"}
    for argv in commands:
        _check_command(argv, complete=False)


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p.name.startswith("rayjob-")], ids=lambda p: p.name)
def test_rayjobs_take_credentials_from_secrets_and_request_gpus(path):
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    for container in _containers(doc):
        for env in container.get("env", []):
            if SECRET_NAME.search(env["name"]):
                assert "value" not in env, f"{env['name']} is inline in {path.name}"
        assert any("secretRef" in e for e in container.get("envFrom", [])), container["name"]
    workers = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert all(
        g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu") for g in workers
    )


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p.name.startswith("rayjob-")], ids=lambda p: p.name)
def test_rayjobs_give_a_stopped_job_time_to_stop_cleanly(path):
    # `ray job stop` sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by default)
    doc = yaml.safe_load(path.read_text())
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in head.get("env", [])}
    assert int(env["RAY_JOB_STOP_WAIT_TIME_S"]) >= 30


def test_cluster_launcher_has_gpu_workers_and_no_inline_credentials():
    doc = yaml.safe_load((INFRA / "cluster-gpu.yaml").read_text())
    assert doc["head_node_type"] in doc["available_node_types"]
    assert "--gpus all" in doc["docker"]["run_options"]
    assert not SECRET_NAME.search(yaml.safe_dump(doc["provider"])), (
        "credentials belong to the instance profile"
    )


def test_dockerfile_copies_existing_paths_and_installs_the_project():
    text = (INFRA / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.MULTILINE)) == 1 and BASE_IMAGE.search(text)
    # the Ray image runs as its non-root user `ray`; this one must not switch back to root
    assert not re.findall(r"^USER (?!ray\b)", text, re.MULTILINE), "the image must run as the user `ray`"
    for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE):
        *sources, _dest = [part for part in line.split() if not part.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), source
    # a regular install (the wheel carries the presets), with the cluster extra's Ray pin
    assert 'pip install ".[cluster]"' in text and "pip install -e" not in text


def test_ray_version_is_pinned_once_and_agrees_everywhere():
    pin = _ray_pin()
    (ray,) = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "ray"]
    assert pin in ray.specifier, f"ray=={pin} does not meet the package's own bound {ray}"

    dockerfile = (INFRA / "Dockerfile").read_text()
    base = BASE_IMAGE.search(dockerfile)
    assert base["ray"] == pin, f"Dockerfile base image has Ray {base['ray']}, pyproject pins {pin}"
    python = f"{base['py']}.{base['minor']}"
    assert python in SpecifierSet(PROJECT["requires-python"]), (
        f"the base image's Python {python} is unsupported"
    )
    assert f"-t {_image_tag()} " in dockerfile, "the Dockerfile's build command names another tag"

    rayjobs = [p for p in MANIFESTS if p.name.startswith("rayjob-")]
    assert rayjobs
    for path in rayjobs:
        doc = yaml.safe_load(path.read_text())
        assert doc["spec"]["rayClusterSpec"]["rayVersion"] == pin, path.name
        for container in _containers(doc):
            assert container["image"] == _image_tag(), f"{path.name}: {container['name']}"
    launcher = yaml.safe_load((INFRA / "cluster-gpu.yaml").read_text())
    assert launcher["docker"]["image"] == _image_tag(), "cluster-gpu.yaml runs another image"


def test_tests_run_the_clusters_ray():
    """The dev extra installs the cluster extra: what the tests exercise is what the cluster runs."""
    own = [d for d in PROJECT["optional-dependencies"]["dev"] if d.startswith("elmo-pipeline[")]
    assert own and "cluster" in own[0].split("[", 1)[1].rstrip("]").split(","), own
    assert importlib.metadata.version("ray") == _ray_pin()


def test_local_s3_script_runs_the_project_module():
    text = (INFRA / "local-s3.sh").read_text()
    module = re.search(r"-m (pipeline\.[a-z_0-9]+)", text).group(1)
    assert importlib.util.find_spec(module) is not None

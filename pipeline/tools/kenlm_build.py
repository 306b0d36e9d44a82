"""KenLM, the standard n-gram estimator, built from the package registry's source: the peer that the
shard stage's Kneser-Ney baseline is checked against (its test and ``benchmarks/kneser_ney.py``).

    python -m pipeline.tools.kenlm_build          # build (about 90 s on 2 cores) or find the cache

It needs a C++ compiler, cmake and Boost's development headers (Debian: ``libboost-program-options-dev
libboost-system-dev libboost-thread-dev libboost-test-dev``, which ``.ci/run`` installs); without
them :func:`find_or_build` raises :class:`KenLMUnavailable` with a one-line reason. What it builds
is cached per version under ``$XDG_CACHE_HOME/elmo-pipeline`` (``~/.cache``): ``lmplz`` (the
estimator) and the ``kenlm`` Python module (the query side: ``Model(arpa).full_scores``).
"""

from __future__ import annotations

import fcntl
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

VERSION = "0.3.0"
"""The ``kenlm`` source distribution on the registry (its C++ is KenLM's, lmplz included)."""

NEEDED_HEADERS = ("boost/program_options.hpp", "boost/thread.hpp", "boost/test/unit_test.hpp", "zlib.h")
DEBIAN_PACKAGES = (
    "libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev zlib1g-dev"
)


class KenLMUnavailable(RuntimeError):
    """KenLM cannot be built here (a tool or header missing, the registry unreachable): one line."""


@dataclass(frozen=True)
class KenLM:
    """A built KenLM: ``lmplz``, the estimator's binary, and ``python_path``, the folder holding the
    ``kenlm`` query module."""

    lmplz: Path
    python_path: Path

    def query_module(self) -> ModuleType:
        """The ``kenlm`` Python module of this build."""
        if str(self.python_path) not in sys.path:
            sys.path.insert(0, str(self.python_path))
        return importlib.import_module("kenlm")

    def estimate(self, text: Path, order: int, arpa: Path, scratch: Path, memory: str = "200M") -> str:
        """``lmplz -o order`` on ``text`` (one sentence a line) into ``arpa``; returns its stderr
        (its counts, discounts and resource report). ``--discount_fallback`` as this project's
        estimator does; ``memory``: its ``-S`` (sort memory: ``200M``, ``40%``)."""
        command = [str(self.lmplz), "-o", str(order), "--text", str(text), "--arpa", str(arpa)]
        command += ["-S", memory, "-T", str(scratch), "--discount_fallback"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"lmplz -o {order} failed: {result.stderr.strip().splitlines()[-1:]}")
        return result.stderr


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "elmo-pipeline" / f"kenlm-{VERSION}"


def _cached(folder: Path) -> KenLM | None:
    lmplz, python_path = folder / "bin" / "lmplz", folder / "python"
    if lmplz.is_file() and any(python_path.glob("kenlm*.so")):
        return KenLM(lmplz, python_path)
    return None


def _missing_tools() -> str | None:
    for tool in ("cmake", "make", "c++"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    for header in NEEDED_HEADERS:
        if not any(Path(root, header).is_file() for root in ("/usr/include", "/usr/local/include")):
            return f"no {header} (Debian: apt-get install {DEBIAN_PACKAGES})"
    return None


def _run(command: list[str], cwd: Path, what: str) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:]
        raise KenLMUnavailable(f"KenLM {VERSION}: {what} failed: {last[0] if last else result.returncode}")


def _build(folder: Path) -> KenLM:
    with tempfile.TemporaryDirectory(prefix="kenlm-build-") as scratch:
        work = Path(scratch)
        pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
        _run(
            [*pip, "download", "--no-deps", "--no-binary", "kenlm", f"kenlm=={VERSION}", "-d", "."],
            work,
            "pip download",
        )
        [source] = work.glob(f"kenlm-{VERSION}.tar.gz")
        with tarfile.open(source) as archive:
            archive.extractall(work, filter="data")
        tree = work / f"kenlm-{VERSION}"
        build = tree / "build"
        build.mkdir()
        _run(["cmake", "..", "-DCMAKE_BUILD_TYPE=Release"], build, "cmake")
        _run(["make", f"-j{os.cpu_count() or 1}", "lmplz"], build, "make lmplz")
        staging = Path(tempfile.mkdtemp(prefix="kenlm-", dir=folder.parent))
        try:
            (staging / "bin").mkdir()
            shutil.copy2(build / "bin" / "lmplz", staging / "bin" / "lmplz")
            _run(
                [*pip, "install", "--no-deps", "--target", str(staging / "python"), str(source)],
                work,
                "pip install",
            )
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)  # whole or not at all: a build stopped half-way leaves no cache
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    built = _cached(folder)
    if built is None:
        raise KenLMUnavailable(f"KenLM {VERSION}: the build left no lmplz or kenlm module in {folder}")
    return built


def find_or_build(folder: Path | None = None) -> KenLM:
    """The cached build, or a new one (one process builds at a time; the others wait for it)."""
    folder = folder or cache_dir()
    found = _cached(folder)
    if found is not None:
        return found
    missing = _missing_tools()
    if missing:
        raise KenLMUnavailable(f"KenLM {VERSION} cannot be built here: {missing}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"kenlm-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cached(folder) or _build(folder)


def main() -> int:
    try:
        kenlm = find_or_build()
    except KenLMUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"lmplz: {kenlm.lmplz}\nkenlm module: {kenlm.python_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

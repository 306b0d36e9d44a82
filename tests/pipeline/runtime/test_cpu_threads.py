import os

import pytest

from pipeline.runtime import cpu_threads


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [(2, 0.1, 2), (2, 0.6, 1), (2, 7.0, 1), (16, 3.4, 13), (16, 40.0, 1), (4, 0.0, 4)],
)
def test_threads_are_the_cores_the_load_leaves(monkeypatch, cores, load, threads):
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert cpu_threads.free_cores() == threads


def test_without_a_load_average_every_core(monkeypatch):
    def none():
        raise OSError("no load average")

    assert 1 <= cpu_threads.usable_cores() <= (os.cpu_count() or 1)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 3)
    monkeypatch.setattr(os, "getloadavg", none)
    assert cpu_threads.free_cores() == 3

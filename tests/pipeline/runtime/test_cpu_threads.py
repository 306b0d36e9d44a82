import os

import pytest

from pipeline.runtime import cpu_threads


@pytest.mark.parametrize(
    ("cores", "idle", "threads"),
    [(2, 0.97, 2), (2, 0.6, 1), (2, 0.0, 1), (16, 0.8, 13), (16, 0.01, 1), (4, 1.0, 4)],
)
def test_threads_are_the_cores_left_idle(monkeypatch, cores, idle, threads):
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(cpu_threads, "idle_share", lambda: idle)
    assert cpu_threads.free_cores() == threads


def test_without_proc_stat_every_core(monkeypatch):
    def none():
        raise OSError("no /proc/stat")

    assert 1 <= cpu_threads.usable_cores() <= (os.cpu_count() or 1)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 3)
    monkeypatch.setattr(cpu_threads, "_cpu_times", none)
    assert cpu_threads.free_cores() == 3


def test_the_idle_share_is_measured_here():
    assert 0.0 <= cpu_threads.idle_share(0.05) <= 1.0

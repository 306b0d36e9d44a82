"""pipeline.embed.startup: the phases of an embed run's start-up, an actor's own report taken off
its first entry (the manifest never holds it), and the pace after the first commit."""

from __future__ import annotations

import time

from pipeline.embed.startup import ACTOR_KEY, AfterFirstCommit, StartupClock, summary_lines


def test_the_phases_add_up_to_the_first_commit_and_the_actors_report_leaves_the_entry():
    clock = StartupClock(time.monotonic() - 3.0)  # the stage began 3 s ago
    clock.mark("checks")
    clock.mark("ray")
    began_at = time.time() + 2.0  # the actor's constructor began 2 s after Ray was up
    report = {"began_at": began_at, "model_load": 1.5, "first_passes": 0.5, "first_write": 0.25}
    first = {"index": 0, "tokens": 100, ACTOR_KEY: report}
    clock.committed(first)
    assert ACTOR_KEY not in first  # recorded as the manifest's entry: without it
    clock.committed({"index": 1, "tokens": 300, ACTOR_KEY: {"model_load": 9.0, "first_passes": 9.0}})
    startup, after = clock.startup(), clock.after_first_commit(tokens=400)
    assert startup["checks_s"] >= 3.0 and startup["ray_s"] >= 0 and startup["first_shard_s"] >= 0
    total = startup["checks_s"] + startup["ray_s"] + startup["first_shard_s"]
    assert abs(startup["first_commit_s"] - total) < 0.01
    assert (startup["actor_model_load_s"], startup["actor_first_passes_s"]) == (1.5, 0.5)  # the first actor's
    assert startup["actor_first_write_s"] == 0.25 and abs(startup["actor_start_s"] - 2.0) < 0.05
    assert "actor_began_at_s" not in startup
    assert after.tokens == 300 and after.seconds >= 0
    lines = summary_lines(startup, AfterFirstCommit(300, 2.0))
    assert lines[0].startswith(
        "  start-up: checks 3.0 s, Ray 0.0 s, first shard 0.0 s (an actor's start 2.0 s, its model load "
        "1.5 s, its first passes 0.5 s, its first write 0.2 s): committed 3.0 s after the start"
    )
    assert lines[1] == "  after the first shard: 300 tokens in 2.0 s = 150 tokens/s"


def test_a_run_that_committed_nothing_reports_no_start_up():
    clock = StartupClock(time.monotonic())
    clock.mark("checks")
    assert clock.startup() == {} and clock.after_first_commit(tokens=0) is None
    assert summary_lines({}, None) == []

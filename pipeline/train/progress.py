"""Training progress on the driver's console: a line per logged train row and per evaluation.

Rank 0 writes its rows to ``metrics.jsonl`` (the record) and hands each to a :class:`ProgressRelay`
actor that the driver started; the driver takes them from it (:class:`RelayFollower`, a thread
long-polling the actor) and prints each new ``train`` / ``eval`` / ``guard`` row once as a line
(:meth:`ProgressLines.lines`; a ``probe`` row too). The storage is never polled, and the loop never waits: rank 0's
call to the relay is not awaited. Printing on the driver rather than on rank 0 keeps the lines free
of Ray's per-process prefixes and the same on a laptop and under ``ray job submit``.

Order is part of the design, not a property of Ray: Ray does not keep the order of calls into an
async actor (measured: 200 unawaited calls into a new relay ran out of order in 17 of 20 trials).
Rank 0's :class:`RelaySender` numbers its rows; the relay hands rows on only in that order (a row
waits for the ones before it); and before the run's final row the sender waits for every call it
still has outstanding, so the driver has them all when the run ends.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable

from pipeline.formats.shard_format import row_baselines

POLL_SECONDS = 1.0
"""How long one take from the relay waits for rows (the follower then checks whether to stop)."""
TAKE_SLACK_S = 60.0
"""How much longer than that the driver waits for the relay's answer before asking again."""
CHECKPOINT_WAIT_SHARE = 0.05
"""Waiting for earlier checkpoint saves longer than this share of the time between two train rows
is worth a warning: the storage does not keep up with ``checkpoint_every``."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _when(seconds: float) -> str:
    """A deadline ``seconds`` from now, in words: ``in 12 s`` or ``12 s past``."""
    return f"in {seconds:.0f} s" if seconds >= 0 else f"{-seconds:.0f} s past"


def baselines_text(row: dict, number: Callable[[float], str] = "{:,.2f}".format) -> str:
    """The held-out baselines of an eval row: ``unigram 812.40, Kneser-Ney 3-gram 190.15``."""
    return ", ".join(f"{label} {number(value)}" for label, value in row_baselines(row))


def _ppl(value: float) -> str:
    return f"{value:,.1f}" if math.isfinite(value) else "inf"


class ProgressLines:
    """Turns metrics rows into console lines; remembers the previous train row for the ETA.

    ``last_step``: the run's last step (for ``step/total`` and the ETA; a time budget's plan moves it).
    """

    def __init__(self, last_step: int):
        self.last_step = last_step
        self._last: tuple[int, float] | None = None  # (step, time) of the previous train row
        self._warned_checkpoints = False

    def lines(self, row: dict) -> list[str]:
        """The lines for a row: one for a ``train``, ``eval`` or ``guard`` row, none for other kinds;
        after a train row, once per run, a warning when saves waited for earlier ones too long."""
        if row.get("kind") == "train":
            return self._train(row)
        if row.get("kind") == "eval":
            scope = ""
            if "eval/batches" in row and "eval/seconds" in row:
                scope = f" [{row['eval/batches']} batches, {row['eval/seconds']:.1f} s]"
            return [
                f"eval  step {row['step']}/{self.last_step}: held-out perplexity "
                f"{_ppl(row['eval/perplexity'])} (fwd {_ppl(row['eval/perplexity_fwd'])}, "
                f"bwd {_ppl(row['eval/perplexity_bwd'])}; {baselines_text(row, _ppl)}){scope}"
            ]
        if row.get("kind") == "guard":
            return [f"guard step {row['step']}/{self.last_step}: {row['message']} [{row['action']}]"]
        if row.get("kind") == "probe":
            return [self._probe(row)]
        if row.get("kind") == "plan":
            return self._plan(row)
        return []

    def _plan(self, row: dict) -> list[str]:
        """A time budget's plan: the new last step; a line for the first plan only (the later ones
        adjust it as the pace becomes better known: in metrics.jsonl)."""
        self.last_step = int(row["plan/total_steps"])
        if row.get("plan/resumed"):
            unused = "; this invocation's time_budget is not used" if row.get("plan/budget_unused") else ""
            return [
                f"plan  step {row['step']}: resumed with the first invocation's plan, which is kept: the run "
                f"ends at step {self.last_step:,}{unused}"
            ]
        if not row.get("plan/first"):
            return []
        spare = row["plan/deadline_in_s"] - row["plan/end_s"]
        if spare < 0:  # the start-up (and the first steps) took the budget: say so, and by how much
            return [
                f"plan  step {row['step']}: the time budget is spent: its deadline is "
                f"{_when(row['plan/deadline_in_s'])} and the final evaluation and export need "
                f"{row['plan/end_s']:.0f} s, so the run overruns it by about {-spare:.0f} s; it ends at step "
                f"{self.last_step:,} (a larger time_budget trains for longer)"
            ]
        return [
            f"plan  step {row['step']}: the time budget fits {self.last_step:,} steps (ends in "
            f"{_duration(max(0.0, row['plan/deadline_in_s']))}, {row['plan/end_s']:.0f} s of it kept for the final "
            "evaluation and export); the learning rate's schedule decays over them"
        ]

    def _probe(self, row: dict) -> str:
        def layers(name: str) -> str:
            found = sorted(k for k in row if k.startswith(f"probe/{name}_layer"))
            return " / ".join(f"{100 * row[k]:.1f}" for k in found)

        return (
            f"probe step {row['step']}/{self.last_step}: part of speech by layer {layers('pos')}% "
            f"(baseline {100 * row['probe/pos_baseline']:.1f}%), word sense {layers('wsd')}% "
            f"(baseline {100 * row['probe/wsd_baseline']:.1f}%) [{row['probe/pos_test_tokens']:,} test tokens, "
            f"{row['probe/wsd_examples']:,} examples, {row['probe/seconds']:.1f} s]"
        )

    def _train(self, row: dict) -> list[str]:
        step, elapsed = int(row["step"]), float(row["time"])
        eta, since = "", elapsed  # the time since the previous row (or since the attempt started)
        if self._last is not None and step > self._last[0] and elapsed > self._last[1]:
            since = elapsed - self._last[1]
            eta = f" | ETA {_duration(since / (step - self._last[0]) * (self.last_step - step))}"
        self._last = (step, elapsed)
        guard = ""
        if "guard/perplexity_fwd" in row:
            guard = (
                f"held-out sample (full softmax) fwd {_ppl(row['guard/perplexity_fwd'])} "
                f"bwd {_ppl(row['guard/perplexity_bwd'])} | "
            )
        # the sampled softmax's loss is no perplexity of the model: said so, beside the full-softmax one
        line = (
            f"train step {step}/{self.last_step} (epoch {row['epoch']:.2f}) | sampled perplexity fwd "
            f"{_ppl(row['train/sampled_perplexity_fwd'])} bwd {_ppl(row['train/sampled_perplexity_bwd'])} | "
            f"{guard}{row['train/tokens_per_s']:,.0f} tok/s | MFU {100 * row['train/mfu']:.2f}%{eta}"
        )
        return [line, *self._checkpoint_warning(row, since)]

    def _checkpoint_warning(self, row: dict, since: float) -> list[str]:
        waited = float(row.get("checkpoint/wait_s", 0.0))
        if self._warned_checkpoints or since <= 0 or waited < CHECKPOINT_WAIT_SHARE * since:
            return []
        self._warned_checkpoints = True
        return [
            f"warning: training waited {waited:.1f} s of the last {since:.1f} s ({waited / since:.0%}, up to "
            f"step {row['step']}) for checkpoint saves to finish writing: the run directory's storage "
            "writes a checkpoint slower than checkpoint_every steps take; raise checkpoint_every or use "
            "faster storage (checkpoint/wait_s in metrics.jsonl and wandb has each interval's wait; said once)"
        ]


class ProgressRelay:
    """A Ray actor (``relay_actor()``) that holds the rows rank 0 hands it (through a
    :class:`RelaySender`: numbered calls that the worker does not await) until the driver takes them
    (``take``, a long poll). Async: a ``take`` waiting for rows never holds up a ``put``.

    Rows come in streams, one per sender (a restarted run has a new one, :meth:`open`). ``rows`` holds
    every row handed on so far in the order of its stream's numbers: a row that arrives before
    one numbered lower waits in ``_early`` until the gap is filled. A new stream first hands on what
    the old one left waiting (its sender died with a call in flight), in order; a late call of an
    old stream is dropped (its rows are in metrics.jsonl; the new stream logs from its checkpoint)."""

    def __init__(self) -> None:
        import asyncio

        self.rows: list[dict] = []
        self._stream = 0
        self._next = 0  # the number of the current stream's next row to hand on
        self._early: dict[int, dict] = {}
        self._added = asyncio.Condition()
        self._stop = False

    async def request_stop(self) -> None:
        """The driver was asked to stop: the ranks stop after the step at which they learn it
        (``pipeline.train.stop``)."""
        self._stop = True

    async def stop_requested(self) -> bool:
        return self._stop

    async def open(self) -> int:
        """A new stream, numbered from 0: the id its sender puts with."""
        async with self._added:
            self.rows.extend(self._early[seq] for seq in sorted(self._early))
            self._early.clear()
            self._stream += 1
            self._next = 0
            self._added.notify_all()
            return self._stream

    async def put(self, stream: int, seq: int, row: dict) -> None:
        async with self._added:
            if stream != self._stream or seq < self._next:
                return
            self._early[seq] = row
            while self._next in self._early:
                self.rows.append(self._early.pop(self._next))
                self._next += 1
            self._added.notify_all()

    async def take(self, start: int, timeout_s: float) -> list[dict]:
        """The rows from index ``start`` on, at once when there are any; else once one comes, or
        ``[]`` after ``timeout_s`` (0: at once). (``asyncio.wait_for`` with a timeout of 0 times out
        before its awaitable runs at all, rows or not: hence the look first.)"""
        import asyncio

        if len(self.rows) <= start and timeout_s > 0:
            async with self._added:
                try:
                    await asyncio.wait_for(self._added.wait_for(lambda: len(self.rows) > start), timeout_s)
                except asyncio.TimeoutError:
                    pass
        return self.rows[start:]


RELAY_TIMEOUT_S = 60.0
"""How long a sender waits for the relay: to open its stream, and at the end of a run for its
outstanding rows and the final one."""
PRUNE_EVERY = 64
"""Rows between two looks at which of a sender's calls are done (it keeps only the others)."""


class RelaySender:
    """Rank 0's side of the relay: ``put(row)`` numbers the row and hands it over without waiting;
    ``finish(row)`` waits for every call still outstanding, then hands over the final row and waits
    for it. A relay that cannot be reached (gone, or not answering within ``RELAY_TIMEOUT_S``)
    turns the sender off: console lines are lost, the record (metrics.jsonl, wandb) is not."""

    def __init__(self, relay) -> None:
        import ray

        self.relay, self._seq, self._outstanding = relay, 0, []
        try:
            self.stream = ray.get(relay.open.remote(), timeout=RELAY_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            self.relay = None

    def put(self, row: dict) -> None:
        if self.relay is None:
            return
        self._outstanding.append(self.relay.put.remote(self.stream, self._seq, row))
        self._seq += 1
        if len(self._outstanding) >= PRUNE_EVERY:
            import ray

            _, self._outstanding = ray.wait(self._outstanding, num_returns=len(self._outstanding), timeout=0)

    def finish(self, row: dict) -> None:
        if self.relay is None:
            return
        import ray

        try:
            ray.get(self._outstanding, timeout=RELAY_TIMEOUT_S)
            self._outstanding = []
            self.put(row)
            ray.get(self._outstanding, timeout=RELAY_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a relay that is gone is no reason to fail a finished run: the record has it
        self._outstanding = []


def relay_actor():
    """A new ``ProgressRelay`` actor: no CPU of its own, not restarted (a run that outlives it only
    loses console lines: metrics.jsonl and wandb hold every row)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(ProgressRelay).remote()


class RelayFollower:
    """While the body of ``with RelayFollower(relay, last_step):`` runs, print the rows the run
    hands to ``relay`` (those of steps after ``from_step``) as lines on ``out``; what is left is
    printed on exit. A rollback of the divergence guard logs its steps again: printed again.
    ``status``: the last ``status`` row the run handed over (its verdict), None before one came."""

    def __init__(
        self,
        relay,
        last_step: int,
        from_step: int = 0,
        out: Callable[[str], None] | None = None,
        poll_s: float = POLL_SECONDS,
    ):
        self.relay, self.poll_s = relay, poll_s
        self.lines = ProgressLines(last_step)
        self.out = out or (lambda text: print(text, file=sys.stderr, flush=True))
        self._printed: set[tuple[str, int, int]] = set()
        self._taken = 0  # rows of the relay printed so far
        self.status: dict | None = None
        self._from_step = from_step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="progress-follower", daemon=True)

    def __enter__(self) -> RelayFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._print_new(timeout_s=0.0)

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._print_new(self.poll_s)

    def _print_new(self, timeout_s: float) -> None:
        import ray

        try:
            rows = ray.get(self.relay.take.remote(self._taken, timeout_s), timeout=timeout_s + TAKE_SLACK_S)
        except ray.exceptions.GetTimeoutError:
            return  # a busy cluster (the relay still starting): the next take asks again
        except ray.exceptions.RayError:
            # the relay is gone (a lost node): the record (metrics.jsonl, wandb) still holds it all
            self._stop.set()
            return
        self._taken += len(rows)
        for row in rows:
            if row.get("kind") == "status":
                self.status = row
            key = (str(row.get("kind")), int(row.get("step", 0)), int(row.get("guard/rollbacks", 0)))
            if key in self._printed or key[1] <= self._from_step:
                continue
            self._printed.add(key)
            for text in self.lines.lines(row):
                self.out(text)

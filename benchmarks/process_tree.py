"""Memory and CPU time of a process tree (a job and every process it starts: Ray's raylet, workers,
actors), sampled from /proc: the benchmarks' one way to say what a whole job used."""

from __future__ import annotations

import os
import threading

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used so far) for every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return table


def _descendants(root: int, table: dict[int, tuple[int, float]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def _pss_bytes(pid: int) -> tuple[int, int]:
    """(PSS, of it the shared-memory pages: Ray's object store lives in /dev/shm) of ``pid``, bytes."""
    found = {}
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith(("Pss:", "Pss_Shmem:")):
                name, value = line.split()[:2]
                found[name] = int(value) * 1024
    except OSError:
        pass
    return found.get("Pss:", 0), found.get("Pss_Shmem:", 0)


class TreeMonitor(threading.Thread):
    """Samples a process tree: peak summed PSS (shared pages counted once) and CPU seconds used
    (last sample per process; a process that lives < one interval is missed)."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.samples: list[int] = []
        self.peak_by_pid: dict[int, int] = {}
        self.own_peak_by_pid: dict[int, int] = {}
        """Peak PSS of each process without its share of shared-memory pages (its own memory)."""
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            table = _proc_table()
            pids = _descendants(self.pid, table)
            measured = {pid: _pss_bytes(pid) for pid in pids}
            each = {pid: pss for pid, (pss, _) in measured.items()}
            for pid, (pss, shmem) in measured.items():
                self.own_peak_by_pid[pid] = max(self.own_peak_by_pid.get(pid, 0), pss - shmem)
            pss = sum(each.values())
            self.peak = max(self.peak, pss)
            for pid, value in each.items():
                self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0), value)
            self.samples.append(pss)
            for pid in pids:
                if pid in table:
                    self.cpu[pid] = table[pid][1]
                    self.names[pid] = _name(pid)  # Ray workers retitle themselves after start
            self.done.wait(self.interval)

    def peak_by_name(self) -> dict[str, int]:
        """Peak PSS per process kind (summed over processes of the same name), largest first."""
        out: dict[str, int] = {}
        for pid, value in self.peak_by_pid.items():
            name = self.names.get(pid, "?")
            out[name] = out.get(name, 0) + value
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def quarter_peaks(self) -> list[int]:
        """Peak PSS in each quarter of the run: flat after the first quarter = bounded memory."""
        n = len(self.samples)
        return [
            max(self.samples[i * n // 4 : max((i + 1) * n // 4, i * n // 4 + 1)], default=0) for i in range(4)
        ]

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    def cpu_by_name(self) -> dict[str, float]:
        """CPU seconds per process kind (Ray names its workers ``ray::<Actor/task>``)."""
        out: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            out[self.names.get(pid, "?")] = out.get(self.names.get(pid, "?"), 0.0) + seconds
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _name(pid: int) -> str:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return "?"
    text = b" ".join(cmd).decode(errors="replace")
    if text.startswith("ray::"):
        return text.split()[0][:60]
    if len(cmd) > 2 and cmd[1] == b"-c":  # a program given inline (an embed actor's shard writers)
        return (
            os.path.basename(cmd[0].decode(errors="replace")) + " -c " + cmd[2].decode(errors="replace")[-30:]
        )
    return os.path.basename(cmd[0].decode(errors="replace")) + (
        " " + cmd[1].decode(errors="replace")[-30:] if len(cmd) > 1 else ""
    )

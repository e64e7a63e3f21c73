"""`free_cores`, the shared block behind `--threads 0` (Linux's /proc/stat), on made-up readings and against a process
that keeps a core busy. The block is word for word the same in every script (test_shared_blocks.py), so one script's
copy is tested. Nothing here depends on what else runs on the machine: other load can only take cores away."""

import io
import os
import subprocess
import sys
import time

import pytest
from conftest import import_script

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux only")


def test_free_cores_on_made_up_readings(monkeypatch):
    """Two CPUs, 100 clock ticks a second. free_cores counts the busy ticks (user, nice, system, irq, softirq; not
    idle or iowait) of this process's CPUs, less this process's own CPU time, per second since the previous call."""
    p = import_script("ppo_fsmn_cartpole")
    readings = []  # (seconds, busy ticks of cpu0, busy ticks of cpu1, this process's CPU seconds)

    def stat():
        _, busy0, busy1, _ = readings[0]
        rows = ["cpu  0 0 0 0 0 0 0 0 0 0"]  # the total line: ignored, the per-CPU lines are read
        rows += [f"cpu{i} {busy} 0 0 5000 7000 0 0 0 0 0" for i, busy in enumerate((busy0, busy1))]
        rows.append("cpu2 900000 0 0 0 0 0 0 0 0 0")  # a CPU this process may not run on: left out
        return io.StringIO("\n".join(rows) + "\n")

    monkeypatch.setattr(p.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(p.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(p, "open", lambda path: stat(), raising=False)
    monkeypatch.setattr(p.time, "perf_counter", lambda: readings[0][0])
    monkeypatch.setattr(p.os, "times", lambda: (readings[0][3], 0.0, 0.0, 0.0, 0.0))

    def free_after(reading: tuple) -> int:
        readings[:] = [reading]
        return p.free_cores(last)

    last = []
    assert free_after((10.0, 1000, 1000, 5.0)) == 2  # no reading yet: every core
    assert free_after((11.0, 1000, 1000, 5.0)) == 2  # idle
    assert free_after((12.0, 1100, 1000, 5.0)) == 1  # another process kept one core busy
    assert free_after((13.0, 1100, 1100, 6.0)) == 2  # this process's own second of work leaves the cores free for it
    assert free_after((14.0, 1200, 1200, 6.0)) == 1  # both busy with other work: still one core, never none
    assert free_after((16.0, 1250, 1250, 6.5)) == 2  # 0.25 cores of other work over 2 s: rounds to none
    assert free_after((17.0, 1320, 1300, 6.5)) == 1  # 1.2 cores of other work: rounds to one


def test_free_cores_counts_a_spinning_process():
    """A process spinning beside this one takes a core from the count, whatever else runs (others only take more)."""
    p = import_script("ppo_fsmn_cartpole")
    cores, reading = len(os.sched_getaffinity(0)), []
    assert p.free_cores(reading) == cores  # no reading yet: every core
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # started
        p.free_cores(reading)
        time.sleep(1.5)
        assert p.free_cores(reading) <= max(1, cores - 1)
    finally:
        spinner.kill()
        spinner.wait()

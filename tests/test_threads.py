"""`free_cores`, the shared block behind `--threads 0`, against a process that keeps one core busy (Linux's /proc/stat).

The block is word for word the same in every script (test_shared_blocks.py), so one script's copy is tested. The
figures assume a quiet machine, as the whole suite does: nothing else running."""

import os
import subprocess
import sys
import time

import pytest
from conftest import import_script

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux only")


def test_free_cores_counts_other_processes_and_not_this_one():
    p = import_script("ppo_fsmn_cartpole")
    cores, reading = len(os.sched_getaffinity(0)), []
    assert p.free_cores(reading) == cores  # no reading yet: every core
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:  # this process's own work leaves the cores free for it
        pass
    assert p.free_cores(reading) == cores
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # started
        p.free_cores(reading)
        time.sleep(1.5)
        assert p.free_cores(reading) == max(1, cores - 1)
    finally:
        spinner.kill()
        spinner.wait()

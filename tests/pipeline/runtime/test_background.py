import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from pipeline.runtime.background import HelperProcess, WriteQueue, in_thread
from pipeline.runtime.child_process import HelperProcessError

ROOT = Path(__file__).resolve().parents[3]


def test_in_thread_hands_back_the_result_or_the_error():
    assert in_thread(lambda: 42, "answer").result(timeout=10) == 42
    with pytest.raises(ZeroDivisionError):
        in_thread(lambda: 1 / 0, "fails").result(timeout=10)


def test_helper_answers_in_order_and_raises_the_work_s_own_errors():
    helper = HelperProcess()
    try:
        futures = [helper.submit(pow, 2, n) for n in range(5)]
        # builtins, so the child imports nothing of this test module
        failed = helper.submit(int, "bad shard")
        unsendable = helper.submit(eval, "__import__('threading').Lock()")
        with pytest.raises(pickle.PicklingError):  # a job that cannot be sent is refused, not queued
            helper.submit(pow, 3, object.__new__(type("Local", (), {})))
        after = helper.submit(pow, 3, 2)
        assert [f.result(timeout=30) for f in futures] == [1, 2, 4, 8, 16]
        with pytest.raises(ValueError, match="bad shard"):
            failed.result(timeout=30)
        with pytest.raises(HelperProcessError, match="cannot be sent back"):
            unsendable.result(timeout=30)
        assert after.result(timeout=30) == 9  # the child goes on after an error
    finally:
        helper.close()


def test_helper_imports_only_what_its_work_needs():
    assert torch is not None and "torch" in sys.modules  # the parent has torch
    helper = HelperProcess()
    try:
        assert helper.submit(eval, "'torch' in __import__('sys').modules").result(timeout=30) is False
    finally:
        helper.close()


def test_close_ends_the_child_and_fails_the_work_in_flight():
    helper = HelperProcess()
    slow = helper.submit(time.sleep, 600)
    helper.close()  # the child ended, not waited for: the sleep's result can never come
    with pytest.raises(HelperProcessError, match="ended"):
        slow.result(timeout=30)
    assert helper.pid is None
    assert helper.submit(pow, 2, 3).result(timeout=30) == 8  # a later submit starts another child
    helper.close()


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    # multiprocessing's spawn re-imports the main script in the child: this script would run twice
    script = tmp_path / "user_script.py"
    script.write_text(
        "import os\n"
        "from pipeline.runtime.background import HelperProcess\n"
        "print('script ran', flush=True)\n"
        "helper = HelperProcess()\n"
        "print(helper.submit(os.getpid).result() != os.getpid(), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["script ran", "True"]


def test_a_write_queue_writes_in_order_beside_the_caller_and_raises_at_the_next_call():
    queue, done, gate = WriteQueue("test"), [], threading.Event()
    queue.submit(lambda: (gate.wait(10), done.append(1)))
    queue.submit(lambda: done.append(2))
    assert done == [] and not queue.idle  # the caller goes on while the first write waits
    gate.set()
    queue.wait()
    assert done == [1, 2] and queue.idle

    def broken():
        raise OSError("disk gone")

    queue.submit(broken)
    queue.submit(lambda: done.append(3))  # the writes after a failure still run
    with pytest.raises(OSError, match="disk gone"):
        queue.wait()
    assert done == [1, 2, 3]
    queue.wait()  # raised once
    queue.close()


def test_one_queued_write_of_the_newest_state_stands_for_later_ones():
    queue, gate, state, written = WriteQueue("test"), threading.Event(), [0], []
    queue.submit(lambda: gate.wait(10))
    for value in range(1, 6):
        state[0] = value
        queue.submit(lambda: written.append(state[0]), latest="file")
    gate.set()
    queue.close()
    assert written == [5]  # four submits found one still queued: it wrote the newest state


def test_a_fenced_write_queue_writes_nothing_once_its_fence_refuses():
    allowed, done = [True], []

    def fence():
        if not allowed[0]:
            raise PermissionError("taken over")

    queue = WriteQueue("test", fence)
    queue.submit(lambda: done.append(1))
    queue.wait()
    allowed[0] = False
    queue.submit(lambda: done.append(2))
    with pytest.raises(PermissionError, match="taken over"):
        queue.wait()
    allowed[0] = True  # for good: a fence that passes again writes nothing either
    for call in (lambda: queue.submit(lambda: done.append(3)), queue.check, queue.wait):
        with pytest.raises(PermissionError, match="taken over"):
            call()
    with pytest.raises(PermissionError, match="taken over"):
        queue.close()  # raises, and ends the queue's thread
    assert done == [1]

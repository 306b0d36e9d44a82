"""pipeline/runtime/child_process.py: a helper started the one way, and its channel."""

from __future__ import annotations

import os

import pytest

from pipeline.runtime.child_process import Channel, HelperProcessError, outcome, result_of, start_python

pytestmark = pytest.mark.subprocess

ECHO = """
import os, sys
from pipeline.runtime.child_process import Channel
channel = Channel.from_fd(int(sys.argv[1]), max_fds=1)
while True:
    try:
        message, fds = channel.receive()
    except EOFError:
        break
    read = [os.pread(fd, 5, 0) for fd in fds]
    channel.send((message, read, os.getsid(0) == os.getpid(), os.environ.get("ELMO_TEST_SECRET")))
"""


def test_a_helper_gets_messages_and_descriptors_and_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_TEST_SECRET", "not for the child")
    monkeypatch.chdir(tmp_path)  # the package is found where this process found it, not in the cwd
    channel, theirs = Channel.pair(max_fds=1)
    child = start_python(
        ["-c", ECHO, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        own_session=True,
        without_env=["ELMO_TEST_SECRET"],
    )
    theirs.close()
    fd = os.memfd_create("test")
    try:
        os.write(fd, b"hello world")
        channel.send({"big": b"x" * (1 << 20)}, [fd])
        (message, read, own_session, secret), _ = channel.receive()
        assert message == {"big": b"x" * (1 << 20)} and read == [b"hello"]
        assert own_session and secret is None
        channel.send("again")
        assert channel.receive()[0][:2] == ("again", [])
        channel.stop_sending()  # the child's next receive ends: it exits
        assert child.wait(timeout=30) == 0
        with pytest.raises(EOFError):
            channel.receive()
    finally:
        os.close(fd)
        channel.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def _divide(a, b):
    return a / b


class _Expected(ValueError):
    pass


def _refuse():
    raise _Expected("one line for the user")


def test_every_helper_answers_in_one_shape_a_value_an_expected_error_or_a_bug_with_its_traceback():
    ours, theirs = Channel.pair()
    child_end = Channel(theirs)
    try:
        for answer in (
            outcome(_divide, 6, 3),
            outcome(_refuse, expected=(_Expected,)),
            outcome(_divide, 1, 0, expected=(_Expected,)),
            (False, ValueError(lambda: None)),  # an exception that does not pickle
        ):
            child_end.answer(answer)
        assert result_of(ours.receive()[0]) == 2.0
        with pytest.raises(_Expected, match="one line for the user") as expected:
            result_of(ours.receive()[0])
        assert not getattr(expected.value, "__notes__", None)  # nothing added to a one-line error
        with pytest.raises(ZeroDivisionError) as bug:
            result_of(ours.receive()[0])
        (note,) = bug.value.__notes__
        assert note.startswith(f"in helper process {os.getpid()}:") and "in _divide" in note
        with pytest.raises(HelperProcessError, match="cannot be sent back"):
            result_of(ours.receive()[0])
    finally:
        ours.close()
        child_end.close()

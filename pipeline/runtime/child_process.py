"""One way to start a Python helper process and talk to it: the shard read-ahead
(``background.HelperProcess``), embed's shard writers and the cluster watchdog.

- :func:`start_python`: ``python -m MODULE ...`` or ``python -c CODE ...``, never multiprocessing's
  spawn (which re-imports the parent's main script in the child: a Ray worker's
  ``default_worker.py`` with all of Ray, or a user's script without a ``__main__`` guard, which
  then runs again). The child finds the code where the parent does: the parent's ``sys.path`` is
  its ``PYTHONPATH``, after the folder this package was imported from. ``own_session`` puts it in a session (and process group) of its own, so a
  Ctrl-C or a scheduler's signal to the job's group is the parent's to act on.
- :class:`Channel`: one end of a socket pair carrying length-framed pickled messages, with file
  descriptors beside a message where needed (``SCM_RIGHTS``: Linux memfds). Pickle is safe here
  only because the two ends are this package's own processes over a pair no one else holds.
- One answer shape for every helper: the child sends :func:`outcome` of each job (``(True, value)``
  or ``(False, the exception)``, with the child's traceback as a note of a bug's exception) with
  :meth:`Channel.answer`, and the parent takes it with :func:`result_of`, which returns the value or
  raises the child's exception. :class:`HelperProcessError` is the one error of a helper that ended
  before it answered, a job it could not read, or an exception that could not travel back.

A child watches its parent with ``background.when_parent_goes`` and sets its signals with
``stopping.child_process``.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

_HEADER = struct.Struct(">Q")
"""A message's length, before the pickled message."""
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The folder that holds ``pipeline/``."""


class HelperProcessError(RuntimeError):
    """A helper process ended before it answered, could not read a job, or raised an exception that
    could not be sent back."""


Outcome = tuple[bool, Any]
"""A job's answer on the wire: ``(True, value)`` or ``(False, exception)``."""


def outcome(work: Callable[..., Any], *args: Any, expected: tuple[type[BaseException], ...] = ()) -> Outcome:
    """``work(*args)``'s answer, run in the child. An ``Exception`` is answered, not raised: one of
    ``expected`` (an error the parent reports in one line) as it is, any other (a bug) with the
    child's traceback added as a note, so the parent's traceback shows where it happened."""
    try:
        return True, work(*args)
    except expected as err:
        return False, err
    except Exception as err:  # noqa: BLE001 - raised again in the parent by result_of
        err.add_note(f"in helper process {os.getpid()}:\n{traceback.format_exc().rstrip()}")
        return False, err


def result_of(answer: Outcome) -> Any:
    """The value of an :func:`outcome`, or its exception raised here."""
    ok, value = answer
    if not ok:
        raise value
    return value


def start_python(
    program: Sequence[str],
    *,
    pass_fds: Sequence[int] = (),
    own_session: bool = False,
    stdin: Any = subprocess.DEVNULL,
    quiet: bool = False,
    without_env: Sequence[str] = (),
) -> subprocess.Popen:
    """``python PROGRAM`` (``["-m", module, ...]`` or ``["-c", code, ...]``) as a child that finds
    the code where this process does. ``pass_fds``: descriptors it inherits (a socket pair's end);
    ``quiet``: its output to /dev/null; ``without_env``: variables it must not inherit."""
    env = {k: v for k, v in os.environ.items() if k not in without_env}
    # this package where the parent found it first (a worktree, an installed copy), then the rest
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *(p for p in sys.path if p)])
    output = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(
        [sys.executable, *program],
        pass_fds=tuple(pass_fds),
        stdin=stdin,
        stdout=output,
        stderr=output,
        start_new_session=own_session,
        env=env,
    )


class Channel:
    """Length-framed pickled messages over one end of a socket pair; ``max_fds`` descriptors may
    come beside a message. :meth:`receive` raises EOFError once the other end has closed."""

    def __init__(self, sock: socket.socket, max_fds: int = 0):
        self.socket, self.max_fds = sock, max_fds

    @classmethod
    def pair(cls, max_fds: int = 0) -> tuple[Channel, socket.socket]:
        """This end as a Channel, and the child's end (pass its ``fileno()`` to the child, then
        close it here once the child started)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(ours, max_fds), theirs

    @classmethod
    def from_fd(cls, fd: int, max_fds: int = 0) -> Channel:
        """The child's end, from the descriptor number its parent passed."""
        return cls(socket.socket(fileno=fd), max_fds)

    def fileno(self) -> int:
        return self.socket.fileno()

    def send(self, message: object, fds: Sequence[int] = ()) -> None:
        self.send_pickled(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), fds)

    def send_pickled(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """A message already pickled (a caller that must know it pickles before it sends)."""
        header = _HEADER.pack(len(data))
        if fds:
            socket.send_fds(self.socket, [header], list(fds))
        else:
            self.socket.sendall(header)
        self.socket.sendall(data)

    def answer(self, answer: Outcome) -> None:
        """Send an :func:`outcome`; one whose exception (or value) does not pickle goes as a
        HelperProcessError naming it."""
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 - an answer that does not pickle
            data = pickle.dumps((False, HelperProcessError(f"{answer[1]!r} cannot be sent back ({err})")))
        self.send_pickled(data)

    def receive(self) -> tuple[Any, list[int]]:
        """The next message and the descriptors sent with it."""
        header, fds, _, _ = socket.recv_fds(self.socket, _HEADER.size, max(self.max_fds, 1))
        if not header:
            raise EOFError
        header += bytes(self._exactly(_HEADER.size - len(header)))
        (size,) = _HEADER.unpack(header)
        return pickle.loads(self._exactly(size)), fds  # noqa: S301 - the package's own processes

    def stop_sending(self) -> None:
        """No more messages from this end: the other's next :meth:`receive` after those sent ends
        in EOFError, while answers can still come back."""
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the other end is gone already

    def close(self) -> None:
        self.socket.close()

    def _exactly(self, size: int) -> bytearray:
        data = bytearray(size)  # returned as it is: pickle reads a bytearray without a copy
        view, got = memoryview(data), 0
        while got < size:
            count = self.socket.recv_into(view[got:])
            if not count:
                raise EOFError
            got += count
        return data

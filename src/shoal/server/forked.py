"""Pure work done in a forked child process, so that it holds no GIL the server's threads share.

A scheduling pass over a long queue is pure Python for hundreds of milliseconds. In the server's
own process every request that reads the store meanwhile waits for the GIL again after each
row's step (``bench/bench_gil_convoy.py``: 5,000 rows read in 1.6 ms alone, 205 ms beside a busy
thread). ``call`` runs such a function in a child forked for it: the child sees the parent's
memory as it was at the fork (copy-on-write: nothing is sent to it), computes on the other
core, and sends its result back pickled through a pipe, which the parent waits on without the
GIL. The parent holds the GIL only for the fork (milliseconds) and the result's unpickling.

The child runs only the function: it never touches the parent's connections, locks or files
(another thread may have held a lock at the fork), runs no collector (which would copy every
page it walks) and leaves by ``os._exit``, with no cleanup of what it inherited. Anything that
goes wrong (no fork on this platform, the function raised, the child died, sent nothing, or
ran past ``timeout_s``) raises ``Failed``; the caller then does the work in its own process,
where a real error shows itself as usual.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Python 3.12 warns at every fork of a process with threads: the child here uses none of them.
warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)

AVAILABLE = hasattr(os, "fork")


class Failed(Exception):
    """The child gave no result; the message says why."""


def call(fn: Callable[..., T], *args, timeout_s: float = 300.0) -> T:
    """``fn(*args)`` computed in a forked child, its result unpickled here (see the module)."""
    if not AVAILABLE:
        raise Failed("this platform cannot fork")
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        raise Failed(f"fork: {e}") from None
    if pid == 0:
        _child(r, w, fn, args)  # never returns
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    poller = select.poll()  # not select(): a server's descriptors run past 1,024
    poller.register(r, select.POLLIN)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise Failed(f"no result after {timeout_s:g} s (the child was killed)")
            chunk = os.read(r, 1 << 20)  # without the GIL
            if not chunk:
                break
            chunks.append(chunk)
    except BaseException as e:
        os.kill(pid, signal.SIGKILL)
        if isinstance(e, OSError):
            raise Failed(f"reading its result: {e}") from None
        raise
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise Failed(f"the child ended with {code} (its error, if any, is in the server's log)")
    try:
        return pickle.loads(b"".join(chunks))
    except Exception as e:  # noqa: BLE001 (whatever a bad pickle raises)
        raise Failed(f"its result: {e!r}") from None


def _child(r: int, w: int, fn: Callable, args: tuple) -> None:
    code = 1
    try:
        os.close(r)
        gc.disable()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # not the server's handlers
            try:
                signal.signal(signum, signal.SIG_DFL)
            except ValueError:  # not the main thread (CPython makes the forking thread the main one)
                pass
        view = memoryview(pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL))
        while view:
            view = view[os.write(w, view):]
        code = 0
    except BaseException:
        try:
            sys.stderr.write(f"forked {getattr(fn, '__name__', fn)} failed:\n{traceback.format_exc()}")
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)

"""A command driven through a pseudo-terminal, as a user at a terminal drives it."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import termios
import time


class Terminal:
    """``argv`` started on a new pseudo-terminal of ``rows`` x ``cols``, with ``env`` over ours."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int = 24, cols: int = 80) -> None:
        self.out = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ.update(env)
            os.execvp(argv[0], argv)
        self.resize(rows, cols)

    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size (its foreground process group gets SIGWINCH)."""
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def read_until(self, marker: bytes, timeout: float = 60) -> str:
        """All the terminal has shown so far, once ``marker`` is in it."""
        deadline = time.monotonic() + timeout
        while marker not in self.out and time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.2)[0]:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:  # EIO: the command has ended and closed the terminal
                    break
        assert marker in self.out, self.out
        return self.out.decode(errors="replace")

    def wait(self) -> int:
        """The command's exit code, once it has ended."""
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        return os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        if self.pid:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
            self.pid = 0
        os.close(self.fd)

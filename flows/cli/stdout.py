"""The CLI's stdout when its reader stops early (`tokcap status | head`).

Python ignores SIGPIPE, so a write to a pipe nobody reads raises `BrokenPipeError`. The
command then ends the way the Python documentation describes (signal module, "Note on
SIGPIPE"): its remaining output goes to /dev/null, with no message, and it exits 141, the
status a shell gives a command that SIGPIPE ended.
"""

from __future__ import annotations

import os
import select
import sys

READER_GONE_EXIT = 141
"""128 + SIGPIPE: the exit status when stdout's reader stopped reading."""


def reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (a broken socket elsewhere is not)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def end_quietly() -> int:
    """Send what is left of stdout to /dev/null, so exiting writes nowhere; the exit status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return READER_GONE_EXIT

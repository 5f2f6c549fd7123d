"""The console of a command that finalizes: one progress line instead of per-batch lines.

While a run finalizes, the console leaves out the INFO lines each batch logs (`batch 3:
finalized ...`, `handed off`, `retired`, and the flow's own `k/N batches` line); the run's
logs in Prefect keep them all. Instead it shows the run's progress line (`tokcap.flows.progress`):
on a terminal one line updated in place (`\\r`; a warning or other log line is printed
above it, and the line drawn again below), in a pipe or CI one line per batch, `k/N
batches, ...`. The terminal is detected with `isatty` on the stream the console writes
to, stderr. Warnings (a masked rollout) and every other line are shown as before.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import TextIO

from tokcap.flows.progress import PROGRESS_FIELD, PROGRESS_LOGGER

BATCH_LINE = re.compile(r"(batch \d+[: ]|\d+/\d+ batches, )")
"""How per-batch lines begin: `batch 3: ...`, `batch 3 was handed off ...`, `3/12 batches, `."""
CLEAR = "\r\x1b[K"


class ProgressLine:
    """Writes the progress to a stream: in place on a terminal, a line each elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = _isatty(stream)
        self.shown = ""  # the text on screen now, not yet ended by a newline (terminal only)
        self.hidden = False
        self.lock = threading.RLock()

    def show(self, text: str, last: bool) -> None:
        """Show `text`; the last line of a run stays on screen, ended by a newline."""
        with self.lock:
            if not self.tty:
                self._write(text + "\n")
                return
            self._write(CLEAR + text + ("\n" if last else ""))
            self.shown, self.hidden = ("" if last else text), False

    def clear(self) -> None:
        """Take the line off the screen before another line is printed."""
        with self.lock:
            if self.shown and not self.hidden:
                self._write(CLEAR)
                self.hidden = True

    def redraw(self) -> None:
        """Draw the line again below what was printed after `clear`."""
        with self.lock:
            if self.shown and self.hidden:
                self._write(self.shown)
                self.hidden = False

    def end(self) -> None:
        """End a line left on screen, so what follows starts on a line of its own."""
        with self.lock:
            if self.shown and not self.hidden:
                self._write("\n")
            self.shown, self.hidden = "", False

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Calls(logging.Handler):
    """A logging handler that hands each record to one function."""

    def __init__(self, call: Callable[[logging.LogRecord], object], level: int) -> None:
        super().__init__(level)
        self.call = call

    def emit(self, record: logging.LogRecord) -> None:
        self.call(record)


def _show(line: ProgressLine, record: logging.LogRecord) -> None:
    """On `tokcap.progress`: shows each progress line."""
    progress = getattr(record, PROGRESS_FIELD, None)
    line.show(record.getMessage(), last=bool(progress and progress.finished))


def _leave_out_batch_lines(line: ProgressLine, record: logging.LogRecord) -> bool:
    """On the console handlers: drops per-batch INFO lines, clears the progress line before
    any other line."""
    if record.levelno == logging.INFO and BATCH_LINE.match(str(record.getMessage())):
        return False
    line.clear()
    return True


@contextlib.contextmanager
def progress_console(enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """Show runs' progress on the console (stderr) while the block runs; see the module."""
    if not enabled:
        yield
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    line = ProgressLine(stream or sys.stderr)
    root, progress = logging.getLogger(), logging.getLogger(PROGRESS_LOGGER)
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    leave_out = partial(_leave_out_batch_lines, line)
    redraw = _Calls(lambda _: line.redraw(), logging.NOTSET)  # on the root, after the console
    show = _Calls(partial(_show, line), logging.INFO)
    saved = (progress.level, progress.propagate)
    for handler in consoles:
        handler.addFilter(leave_out)
    root.addHandler(redraw)
    progress.addHandler(show)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    try:
        yield
    finally:
        progress.removeHandler(show)
        progress.setLevel(saved[0])
        progress.propagate = saved[1]
        root.removeHandler(redraw)
        for handler in consoles:
            handler.removeFilter(leave_out)
        line.end()

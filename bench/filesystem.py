"""What filesystem a bench writes to: its type, device and, for ext4, whether it has a journal.

Durable-create figures depend on it. On ext4 without a journal, every new inode skips the
inodes deleted in the last minute (up to five while their inode table block is not yet
written back), checking them one by one, so a bench that deletes files and then creates more
measures that scan as well.
"""

from __future__ import annotations

import os


def _mount_of(path: str) -> tuple[str, str, str] | None:
    """(device, mount point, type) of the mount holding `path`, from /proc/mounts."""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            rows = [line.split()[:3] for line in mounts if line.strip()]
    except OSError:
        return None
    real = os.path.realpath(path)
    best = None
    for device, point, kind in rows:
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[1])):
            best = (device, point, kind)
    return best


def _journal(device: str) -> str:
    """ext4 lists each journal under /proc/fs/jbd2 as `<device name>-<number>`."""
    if not os.path.isdir("/proc/fs/jbd2"):
        return "journal unknown"
    name = os.path.basename(os.path.realpath(device))
    has = any(entry.rpartition("-")[0] == name for entry in os.listdir("/proc/fs/jbd2"))
    return "with a journal" if has else "no journal"


def describe(path: str) -> str:
    """One line naming the filesystem under `path`, for a bench's header."""
    mount = _mount_of(path)
    if mount is None:
        return f"filesystem of {path}: unknown"
    device, point, kind = mount
    detail = f", {_journal(device)}" if kind == "ext4" else ""
    return f"filesystem of {path}: {kind} on {device} at {point}{detail}"

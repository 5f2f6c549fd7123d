"""Prefect tasks: thin, one concern each, over capture_core; installed as `tokcap.tasks`.

Imported as a top-level `tasks` (old code run from a checkout) it refuses in one line, so a
second copy of every task is never loaded beside the installed one.
"""

if __name__ == "tasks":
    raise ImportError(
        "tokcap's tasks are `tokcap.tasks` now: import them as `tokcap.tasks.<module>`"
    )

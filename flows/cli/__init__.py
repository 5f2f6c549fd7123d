"""The `tokcap` command line: each command runs its flow and prints a summary.

Every argument is checked, and every local path made absolute, before any Prefect server or
flow starts. Without `PREFECT_API_URL` the CLI starts a temporary Prefect server (see
`tokcap.flows.runners`). Exit status: 0 success, 1 the run failed (each failure on one line; the
tracebacks are in the flow-run logs), 2 bad usage or input (with the close match of a
mistyped option, command or choice; an unknown run id: never started), 3 the run started and
has not ended (`status` of a run still going or interrupted, or a command whose Prefect API
went away mid-run: the printed command completes it) or `submit` placed a file it could not
announce (the inbox's scheduled pass finalizes it), 141 stdout's reader stopped (`| head`).
Credentials given with `--storage-option` go to the environment, never to flow parameters.
"""

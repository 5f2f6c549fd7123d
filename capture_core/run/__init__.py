"""Run bookkeeping and handoff: a run's files, planning, finalize/upload/retire of a batch.

`run_layout` names a run's files, `rollout_io` plans the input, `finalize` is the one
finalize path, `handoff` uploads and retires a batch by receipt, `run_progress` and
`run_report` tally and summarise, `inbox` claims files, `capture_source` opens and clears
capture sources, `crash_points` names where crash tests kill the process.
This layer may import `builder`, `store` and `storage`, never the seed API modules.
"""

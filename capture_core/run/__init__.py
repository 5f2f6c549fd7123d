"""Run bookkeeping and handoff: a run's files, planning, finalize/upload/retire of a batch.

`run_layout` names a run's files, `rollout_io` plans the input, `finalize` is the one
finalize path, `batch_finalize` finalizes a batch, `part_upload` hands its parts off under a
`receipt`, `verified_read` reads a part back as its receipt certifies it, `retire_verdict`
and `retirement` retire a batch by receipt, `concurrency` sets how many rollouts at once,
`ledger_versions` gives each ledger line its weight-version figures, `inbox` claims files,
`capture_source` opens and clears capture sources, `store_check` refuses a store that holds
none of a run's captures, `crash_points` names where crash tests kill the process.
A batch's trainer rows, their cursors and the stream over runs live in `capture_core.rows`;
the operator's views of a run (reports, progress, status, the runs of a destination) in
`capture_core.operator`.
This layer may import `builder`, `store` and `storage`, never the seed API modules.
"""

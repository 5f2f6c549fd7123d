"""The operator's views of a run: what it did, how far it got, and what to do next.

`run_report` summarises a run's ledger in counts and tables, `run_markdown` writes its
report, `mask_reasons` names the reasons it masked rollouts and what each means,
`run_outcome` says in one line how it ended, `version_tally` tallies the weight versions it
delivered, `run_progress` follows a run as it goes, `run_pace` says how fast, `run_status`
reads what a destination shows about a run now (receipts, ledger, consumers'
acknowledgements), `run_verdict` gives a run its one state word and exit code from that and
from what Prefect shows, and `run_index` lists the runs of a destination. They read what
the handoff (`capture_core.run`) and the rows (`capture_core.rows`) wrote and never write a
run's records, so what a run prints cannot change what it hands off or retires. This
package does not import Prefect.
"""

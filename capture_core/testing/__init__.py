"""The test kit shipped with the library, for checking your own stores and pipelines.

`conformance` runs the capture-store contract against any sink/source pair, `contracts`
holds the contract suites (one test per behaviour) to subclass per store, `synthetic`
builds simple agent captures and `agent_captures` seeded realistic ones with their finished
records (auxiliary calls, sub-agents, retries, lost calls; `tokcap demo --rollouts N`),
and `trace_shapes` seeded episodes of the shapes multi-trace delivery is for
(`tokcap make-inputs --delivery all_traces`); both record their calls through
`seeded_writer`.
Crash tests name the run layer's crash points (`capture_core.run.crash_points`). The
library never imports this package.
"""

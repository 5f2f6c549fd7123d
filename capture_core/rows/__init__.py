"""The trainer's side of a handoff: rows, their versions, the consumers' cursors, the stream.

`trainer_rows` writes and reads a batch's rows part; `row_provenance` places each
position's weight version; `row_cursor` records what each named consumer acknowledged;
`row_consumer` reads one run's parts, verified; `stream` reads every run of a destination as
one resumable stream split across ranks; `corrections` computes the off-policy corrections
a trainer applies. The rows build on a run's handoff (its layout, receipts and verified
reads) and never on its reports. `capture_core.dataset` is the public face. This package
does not import Prefect.
"""

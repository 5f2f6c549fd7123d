"""`tokcap retrigger` of a run whose input has a malformed line says the run cannot complete
until its input changes, naming the file and line and what to do, and exits 1; a second
retrigger says the same, never a bare "1 still failing"."""

from __future__ import annotations

import pytest

from tests.support.pipeline_helpers import finalize_args_for, receipt_args, run_cli

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_retrigger_of_a_malformed_line_says_the_input_must_change(
    run_inputs: dict[str, str], prefect_api: str
) -> None:
    with open(run_inputs["rollouts"], "a") as out:
        out.write('{"truncated": \n')
    first = run_cli(finalize_args_for(run_inputs, "bad-line", "--batch-size", "2"), prefect_api)
    assert first.returncode == 1, first.stdout + first.stderr[-2000:]
    args = receipt_args("retrigger", run_inputs["dest"], "bad-line", run_inputs["store"])
    for _ in range(2):
        again = run_cli(args, prefect_api)
        said = again.stdout + again.stderr
        assert again.returncode == 1, said[-2000:]
        assert "cannot complete until its input changes" in said, said[-2000:]
        assert f"{run_inputs['rollouts']} has 1 malformed line(s) (line 5:" in said, said[-2000:]
        assert "finalize them as a new run" in said, said[-2000:]


def test_an_automatic_retrigger_of_a_malformed_line_ends_the_chain(
    run_inputs: dict[str, str],
) -> None:
    """The automation retriggers `Failed`, never `NeedsAttention`: the chain stops at once."""
    from tokcap.flows.finalize import finalize_run
    from tokcap.flows.retrigger import NEEDS_ATTENTION, retrigger_failed

    with open(run_inputs["rollouts"], "a") as out:
        out.write("not json\n")
    store, dest = run_inputs["store"], run_inputs["dest"]
    first = finalize_run(run_inputs["rollouts"], store, dest, "bad-auto", return_state=True)
    assert first.is_failed(), first
    state = retrigger_failed(dest, "bad-auto", store, retrigger=1, return_state=True)
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "cannot complete until its input changes" in state.message, state.message
    assert "line 5:" in state.message, state.message

"""Reliability figures: crash points survived, faults injected and survived, bad inputs tried,
racing rollouts checked, and records lost (which must be 0).

Runs the tests marked `integrity` (attack cases, crash points, faults, property checks) with
figure recording switched on and prints the totals.
Usage: .venv/bin/python -m bench.reliability_report [extra pytest arguments]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter

import orjson

LABELS = {
    "crash_points_survived": "crash points survived (SIGKILL, then re-run)",
    "faults_injected": "S3 faults injected (500, 503, dropped connections)",
    "fault_runs_survived": "runs completed correctly under 10% faults",
    "racing_rollouts_checked": "rollouts finalized while 8 writers raced",
    "racing_late_writes_caught": "late writes caught (refused or retirement refused)",
    "bad_inputs_tried": "bad inputs tried",
    "secret_checks": "outputs searched for a planted secret (found: 0)",
    "records_lost": "records lost",
    "wrong_tokens_delivered": "wrong tokens delivered",
}


def main() -> int:
    figures_file = tempfile.mktemp(prefix="tokcap-reliability-", suffix=".jsonl")
    env = {**os.environ, "TOKCAP_RELIABILITY_FIGURES": figures_file}
    command = [sys.executable, "-m", "pytest", "-q", "-m", "integrity", "tests", *sys.argv[1:]]
    result = subprocess.run(command, env=env)
    totals: Counter[str] = Counter({name: 0 for name in LABELS})
    cases: Counter[str] = Counter()
    if os.path.exists(figures_file):
        with open(figures_file, "rb") as f:
            for line in f:
                figure = orjson.loads(line)
                if figure["name"] == "attack_case":
                    cases[figure["case"]] += figure["value"]
                else:
                    totals[figure["name"]] += figure["value"]
        os.remove(figures_file)
    print("\ntokcap reliability report")
    for name, label in LABELS.items():
        print(f"  {label:<55} {totals[name]}")
    print(f"  attack cases tried and closed: {len(cases)}")
    for case in sorted(cases):
        print(f"    - {case}")
    print(f"  tests: {'passed' if result.returncode == 0 else 'FAILED'}")
    clean = totals["records_lost"] == 0 and totals["wrong_tokens_delivered"] == 0
    return 0 if result.returncode == 0 and clean else 1


if __name__ == "__main__":
    sys.exit(main())

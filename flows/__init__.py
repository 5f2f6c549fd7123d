"""Prefect flows and the `tokcap` command line, installed as `tokcap.flows`.

Imported as a top-level `flows` (an entrypoint of a deployment made before tokcap moved under
its own name, run from a checkout), it refuses in one line that says what to do, rather than
half-loading a second copy of every flow.
"""

if __name__ == "flows":
    raise ImportError(
        "tokcap's flows are `tokcap.flows` now: this deployment or import names the old `flows` "
        "package; redeploy with the shipped prefect.yaml (TOKCAP_INBOX=... TOKCAP_STORE=... "
        'TOKCAP_DEST=... prefect --no-prompt deploy --all --prefect-file "$(tokcap deployments)")'
    )

"""capture_core stays usable without Prefect, and loads S3 clients and pyarrow only when used."""

from __future__ import annotations

import subprocess
import sys


def test_capture_core_imports_no_prefect_s3fs_or_boto() -> None:
    code = (
        "import sys, capture_core, capture_core.store, capture_core.testing.conformance\n"
        "import capture_core.storage, capture_core.testing.contracts\n"
        "import capture_core.records, capture_core.ids, capture_core.protocols\n"
        "import capture_core.builder, capture_core.consumer, capture_core.run.batch_finalize\n"
        "import capture_core.run.part_upload, capture_core.run.retirement\n"
        "import capture_core.run.verified_read\n"
        "import capture_core.delivery, capture_core.config, capture_core.rows.row_cursor\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prefect', 's3fs', 'boto3', 'botocore', 'aiobotocore', 'pyarrow'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_only_the_gateway_loads_the_web_stack() -> None:
    """starlette, uvicorn, httpx and prometheus_client load when a gateway is used, not before."""
    code = (
        "import sys, capture_core, capture_core.store, capture_core.records, capture_core.ids\n"
        "import capture_core.builder, capture_core.consumer, capture_core.delivery\n"
        "import capture_core.run.batch_finalize, capture_core.testing.conformance\n"
        "web = ('starlette', 'uvicorn', 'httpx', 'prometheus_client', 'capture_core.gateway')\n"
        "print(sorted(m for m in sys.modules if m.startswith(web)))\n"
        "import capture_core.gateway.app\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(web[:4])}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = out.stdout.split("\n")[:2]
    assert before == "[]"
    assert after == "['httpx', 'prometheus_client', 'starlette']"

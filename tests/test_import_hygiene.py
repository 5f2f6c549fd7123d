"""capture_core stays usable without Prefect and without loading S3 clients."""

from __future__ import annotations

import subprocess
import sys


def test_capture_core_imports_no_prefect_s3fs_or_boto() -> None:
    code = (
        "import sys, capture_core, capture_core.store, capture_core.conformance\n"
        "import capture_core.storage, capture_core.testing.contracts\n"
        "import capture_core.records, capture_core.ids, capture_core.protocols\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prefect', 's3fs', 'boto3', 'botocore', 'aiobotocore'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_old_test_kit_paths_name_the_same_objects() -> None:
    from capture_core import conformance, faults, synthetic
    from capture_core.testing import conformance as new_conformance
    from capture_core.testing import faults as new_faults
    from capture_core.testing import synthetic as new_synthetic

    pairs = ((conformance, new_conformance), (faults, new_faults), (synthetic, new_synthetic))
    for old, new in pairs:
        assert old.__all__ and all(getattr(old, n) is getattr(new, n) for n in old.__all__)

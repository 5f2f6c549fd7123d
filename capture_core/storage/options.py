"""The deliberate S3 client settings, merged under whatever storage options a caller passes.

S3 clients are built without a listing cache (a listing must show every other client's
completed writes) and with short, bounded retries: longer outages are the task retries' job.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

S3_DEFAULTS: dict[str, Any] = {
    "use_listings_cache": False,
    "config_kwargs": {
        "connect_timeout": 5,
        "read_timeout": 60,
        "retries": {"max_attempts": 2, "mode": "standard"},
    },
}
# s3fs's own retry loop multiplies botocore's attempts: 2 x 2 tries per request, which fails
# an unreachable endpoint in about a second. Longer outages are the task-level retries' job.
S3_CLIENT_RETRIES = 2


def s3_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options merged over the deliberate S3 defaults (config_kwargs merged key by key)."""
    merged = copy.deepcopy(S3_DEFAULTS)
    for key, value in options.items():
        if key == "config_kwargs":
            merged["config_kwargs"].update(value)
        else:
            merged[key] = value
    merged["use_listings_cache"] = False
    return merged

"""Which S3 endpoint a client talks to, and what to say when it does not answer.

botocore says only `Could not connect to the endpoint URL: "<url>"`. The message here names
the endpoint (scheme, host and port: never credentials), says to check that it is running and
reachable, and names the setting that chose it: the `endpoint_url` storage option, the AWS
environment, or AWS's own default. Connection errors are recognised by class name, so
botocore and aiohttp are not imported here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

CONNECTION_ERRORS = {
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ServerDisconnectedError",
}
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
WHAT_HAPPENED = {
    "ConnectionClosedError": "dropped the connection",
    "ServerDisconnectedError": "dropped the connection",
    "ReadTimeoutError": "did not answer in time",
    "ConnectTimeoutError": "did not accept the connection in time",
}


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` says the endpoint could not be reached or dropped the connection."""
    return bool({cls.__name__ for cls in type(exc).__mro__} & CONNECTION_ERRORS)


def _configured(options: Mapping[str, Any]) -> tuple[str | None, str]:
    """The endpoint the options or the environment name, and which setting named it."""
    if options.get("endpoint_url"):
        return str(options["endpoint_url"]), (
            "the endpoint_url storage option (--storage-option endpoint_url=..., or "
            "storage_options in a deployment)"
        )
    client = options.get("client_kwargs") or {}
    if isinstance(client, Mapping) and client.get("endpoint_url"):
        return str(client["endpoint_url"]), "client_kwargs.endpoint_url of the storage options"
    for name in ENDPOINT_ENV:
        if os.environ.get(name):
            return os.environ[name], f"{name} in the environment"
    return None, "AWS's default for the region (set endpoint_url for an S3-compatible store)"


def _origin(url: str) -> str:
    """`http://host:port` of a URL, without credentials or path."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.hostname:
        return url
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def unreachable_message(
    url: str, what: str, exc: BaseException, options: Mapping[str, Any] | None = None
) -> str:
    """Why `url` could not be used while trying to `what`, and what to check."""
    configured, setting = _configured(options or {})
    tried = (getattr(exc, "kwargs", None) or {}).get("endpoint_url") or configured
    endpoint = f"the S3 endpoint {_origin(tried)}" if tried else "the S3 endpoint"
    happened = next(
        (WHAT_HAPPENED[c.__name__] for c in type(exc).__mro__ if c.__name__ in WHAT_HAPPENED),
        "did not answer",
    )
    return (
        f"storage at {url} is unreachable while trying to {what}: {endpoint} {happened} "
        f"({type(exc).__name__}); check that it is running and reachable from this machine "
        f"(address, port, network), then retry; the endpoint is set by {setting}"
    )

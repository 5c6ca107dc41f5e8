"""URIs for local paths and `s3://` alike, and the storage options the environment implies.

S3 options come from the caller or from the environment (`SVFX_S3_ENDPOINT_URL` and the usual
AWS variables), so any S3-compatible store works and workers can be handed the same options;
`storage.location.Location` carries a URI with its options and makes the fsspec filesystem.
"""

from __future__ import annotations

import os
from typing import Any

from core.errors import missing_extra
from storage.errors import StorageError


def split_scheme(uri: str) -> tuple[str | None, str]:
    """A URI's scheme as written (None for a plain path) and the rest after ``://``:
    ``s3://b/k`` -> ``("s3", "b/k")``, ``file:///x`` -> ``("file", "/x")``."""
    # not fsspec.core.split_protocol: it also splits "data:" paths and takes "c://" for no scheme
    if "://" not in uri:
        return None, uri
    scheme, rest = uri.split("://", 1)
    return scheme, rest


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names object storage (``s3://``...): the one test of the product; a
    plain path or a ``file://`` URL is local."""
    scheme, _ = split_scheme(uri)
    return scheme is not None and scheme != "file"


def check_driver(uri: str) -> None:
    """Refuse, naming the extra to install, a URI whose filesystem's package is not here:
    S3 is the optional `s3` extra (s3fs, botocore), so local-disk installs go without it."""
    if uri.startswith("s3://") and (missing := missing_extra("s3fs", "s3")):
        raise StorageError(f"{uri}: S3 needs s3fs, and {missing}")


def default_storage_options(uri: str) -> dict[str, Any]:
    """Storage options implied by the environment for this URI (empty for local paths)."""
    if not uri.startswith("s3://"):
        return {}
    options: dict[str, Any] = {}
    endpoint = os.environ.get("SVFX_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    return options


def join(base: str, *parts: str) -> str:
    """Join URI parts with '/' (fsspec paths use '/' on every platform)."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out

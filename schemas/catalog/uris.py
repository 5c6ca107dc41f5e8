"""One spelling per file, so a path typed by an artist finds the row the flow wrote."""

from __future__ import annotations

import os.path
from urllib.parse import unquote

from storage.uri import is_remote


def normalise_uri(uri: str) -> str:
    """Local paths (plain, relative, ``~`` or ``file://``) become absolute POSIX paths without
    ``.``/``..`` (lexically: symlinks are not resolved); other URLs (``s3://``) are kept."""
    uri = uri.strip()
    if not uri:
        return ""
    if uri.startswith("file://"):
        rest = unquote(uri[len("file://") :])
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        uri = rest
    elif is_remote(uri):
        return uri
    return os.path.normpath(os.path.abspath(os.path.expanduser(uri)))

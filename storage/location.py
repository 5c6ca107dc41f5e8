"""A place in storage as one value: a URI and the fsspec options that reach it.

Like fsspec's filesystem (protocol and options, then paths) or zarr-python's ``StorePath``
(a store and a path in it), a `Location` is where bytes are *and* how to get to them, so the
two never travel apart. It is a small frozen value: hashable, picklable (chunk jobs carry
Locations to Dask workers), its options never mutated.

``options`` are fsspec storage options, with two meanings kept apart as they always were:

- ``None``: from the environment of the process that uses the location
  (`storage.uri.default_storage_options`: ``SVFX_S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL``
  for ``s3://``, nothing for local paths), resolved each time a filesystem is made;
- a mapping (even an empty one): exactly these options, the environment is not consulted.

`Location.or_environment` turns an empty mapping into ``None``: how the options the flow
takes from the settings (``{}`` when the settings name no S3 endpoint) are handed to
workers, each of which then takes its own environment's.

A plain URI string is a Location with ``options=None`` (`as_location`): the functions of
`storage` take ``Location | str`` (see `Where`), since a local path is what most of their
callers naturally have.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec import AbstractFileSystem
from fsspec.core import split_protocol

from storage.uri import check_driver, default_storage_options, is_remote, join


class StorageOptions(Mapping[str, Any]):
    """fsspec storage options, frozen: nested mappings are frozen too; `to_dict` gives the
    plain dicts fsspec takes (fresh each time, so nothing fsspec does reaches back here)."""

    __slots__ = ("_items",)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        items = {str(key): _frozen(value) for key, value in dict(options or {}).items()}
        object.__setattr__(self, "_items", items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("StorageOptions are frozen")

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == _thawed(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True, default=repr))

    def __repr__(self) -> str:  # keys only: options may hold credentials
        return f"StorageOptions(keys={sorted(self._items)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageOptions, (self.to_dict(),))

    def to_dict(self) -> dict[str, Any]:
        """The options as plain dicts (nested mappings copied; other values as given)."""
        return {key: _thawed(value) for key, value in self._items.items()}


def _frozen(value: Any) -> Any:
    return StorageOptions(value) if isinstance(value, Mapping) else value


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(key): _thawed(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class Location:
    """A URI and the fsspec options that reach it (``None``: from the environment)."""

    uri: str
    options: StorageOptions | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str):
            raise TypeError(f"a Location's uri is a str, not {type(self.uri).__name__}")
        if self.options is not None and not isinstance(self.options, StorageOptions):
            object.__setattr__(self, "options", StorageOptions(self.options))

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:  # the option keys only: options may hold credentials
        if self.options is None:
            return f"Location({self.uri!r})"
        return f"Location({self.uri!r}, options={sorted(self.options)})"

    @property
    def is_remote(self) -> bool:
        return is_remote(self.uri)

    def fsspec_options(self) -> dict[str, Any]:
        """The options to hand fsspec: the environment's when ``options`` is None."""
        if self.options is None:
            return default_storage_options(self.uri)
        return self.options.to_dict()

    def fs_and_path(self) -> tuple[AbstractFileSystem, str]:
        """The filesystem that serves this location and the path inside it."""
        check_driver(self.uri)
        fs, path = fsspec.core.url_to_fs(self.uri, **self.fsspec_options())
        return fs, path

    def join(self, *parts: str) -> Location:
        """A location under this one (parts joined with '/'), reached the same way."""
        return Location(join(self.uri, *parts), self.options)

    def at(self, uri: str) -> Location:
        """Another URI on the same storage, reached with the same options (a path the caller
        computed, e.g. `tasks.output_paths.ShotOutputPaths.exr`); the protocol must match."""
        if _protocol(uri) != _protocol(self.uri):
            raise ValueError(f"{uri} is not on the same storage as {self.uri}")
        return Location(uri, self.options)

    def or_environment(self) -> Location:
        """This location, with empty options meaning "from the environment" (None)."""
        if self.options is not None and not self.options:
            return Location(self.uri)
        return self


Where = Location | str  # what the functions of `storage` take: a str is `Location(str)`


def as_location(where: Where) -> Location:
    """``where`` as a Location: a plain URI takes its options from the environment."""
    if isinstance(where, Location):
        return where
    if isinstance(where, str):
        return Location(where)
    raise TypeError(f"expected a Location or a URI string, not {type(where).__name__}")


def _protocol(uri: str) -> str:
    protocol, _ = split_protocol(uri)
    return "file" if protocol in (None, "file", "local") else str(protocol)

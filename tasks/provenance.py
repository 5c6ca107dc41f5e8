"""What every output's provenance names about this platform itself."""

from __future__ import annotations


def platform_version() -> str:
    """This platform's version, as installed (recorded in every output's provenance)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sapiens-vfx")
    except PackageNotFoundError:
        return "0+unknown"

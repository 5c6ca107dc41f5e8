"""The trackers by name: one module per tracker, imported only when used (their clients,
``gazu`` and ``shotgun_api3``, are optional), each with ``connect(settings) -> Tracker``."""

from __future__ import annotations

import importlib

from schemas.settings import Settings

from .errors import PublishRefused
from .tracker import Tracker

ADAPTERS: dict[str, str] = {"kitsu": "publish.kitsu", "shotgrid": "publish.shotgrid"}


def tracker_names() -> tuple[str, ...]:
    return tuple(ADAPTERS)


def open_tracker(settings: Settings, name: str | None = None) -> Tracker:
    """The tracker ``name`` (default: SVFX_PUBLISH), connected and logged in. Raises
    PublishRefused when none is configured or the name is unknown, TrackerUnavailable when it
    cannot be reached or refuses the login."""
    name = name or settings.publish
    if not name:
        raise PublishRefused(
            "no tracker to publish to: set SVFX_PUBLISH to "
            + " or ".join(ADAPTERS)
            + " (or pass --tracker)"
        )
    if name not in ADAPTERS:
        raise PublishRefused(f"unknown tracker {name!r}: one of {', '.join(ADAPTERS)}")
    module = importlib.import_module(ADAPTERS[name])
    tracker: Tracker = module.connect(settings)
    return tracker

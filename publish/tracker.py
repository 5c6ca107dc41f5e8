"""The one protocol every tracker adapter speaks, like OpenTimelineIO's adapters: a name and
`publish`, which is idempotent (the same item published again finds what it made and makes
nothing new) and answers the tracker's entity ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .item import PublishItem


@dataclass(frozen=True)
class Published:
    """What a publish made (or found, ``created`` False) in the tracker, by entity: ids as
    the tracker gives them (ints on ShotGrid, UUID strings on Kitsu), lists for files."""

    entity_ids: dict[str, Any] = field(default_factory=dict)
    created: bool = True


class Tracker(Protocol):
    name: str  # kitsu, shotgrid: the value of SVFX_PUBLISH

    def publish(self, item: PublishItem) -> Published:
        """Make the item's version, preview and file records under its shot and task, or find
        them when they exist. Raises TrackerUnavailable (down, login refused) or
        TrackerRefused (an entity missing or a name refused), naming what."""
        ...


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every secret in it replaced by ``***`` (a library's message may quote
    what it was given)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text

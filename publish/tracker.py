"""The one protocol every tracker adapter speaks, like OpenTimelineIO's adapters: a name and
`publish`, which is idempotent (the same item published again finds what it made and makes
nothing new) and answers the tracker's entity ids."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import PublishRefused
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


def login_settings(
    tracker: str,
    named: dict[str, Any],
    secret_name: str,
    read_secret: Callable[[], str | None],
    secret_file: Any,
) -> str:
    """The tracker's secret, once every setting it needs is there: PublishRefused naming each
    missing one (``named``: setting name -> value; the secret is ``secret_name`` or its
    ``_FILE``), or the file that holds the secret when it cannot be read."""
    missing = [name for name, value in named.items() if not value]
    try:
        secret = read_secret()
    except OSError as exc:
        raise PublishRefused(
            f"{secret_name}_FILE {secret_file}: cannot be read ({exc.strerror})"
        ) from None
    if not secret:
        missing.append(f"{secret_name} (or {secret_name}_FILE)")
    if missing:
        raise PublishRefused(f"publishing to {tracker} needs {', '.join(missing)}")
    return secret

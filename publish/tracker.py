"""The one protocol every tracker adapter speaks, like OpenTimelineIO's adapters: a name and
`publish`, which is idempotent (the same item published again finds what it made and makes
nothing new) and answers the tracker's entity ids."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from .errors import PublishRefused, TrackerLoginRefused, TrackerRefused, TrackerUnavailable
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


@dataclass(frozen=True)
class ClientErrors:
    """How a tracker's client names its failures (exception class names): a login refused
    (and the settings to check), the tracker away, a publish refused."""

    login: frozenset[str]
    login_settings: str
    unavailable: frozenset[str]
    unavailable_types: tuple[type[BaseException], ...]
    refused: frozenset[str]


def translated(
    exc: Exception, tracker: str, where: str, secret: str | None, errors: ClientErrors
) -> Exception:
    """A client's exception as ours (the login refused, the tracker away, a name refused), the
    secret never in it; anything else as it is."""
    message = redact(f"{type(exc).__name__}: {exc}", secret)
    kind = type(exc).__name__
    if kind in errors.login:
        return TrackerLoginRefused(
            f"{tracker} at {where} refuses the login ({message}); check {errors.login_settings}"
        )
    if isinstance(exc, errors.unavailable_types) or kind in errors.unavailable:
        return TrackerUnavailable(f"{tracker} at {where} is not reachable: {message}")
    if kind in errors.refused:
        return TrackerRefused(f"{tracker} at {where} refuses the publish: {message}")
    return exc


class TrackerAdapter:
    """What the adapters share: `publish` runs the adapter's ``_publish`` and answers any
    other failure of its client as ours; the refusals that name a missing entity."""

    name: ClassVar[str]  # the value of SVFX_PUBLISH
    label: ClassVar[str]  # the tracker's name in messages
    errors: ClassVar[ClientErrors]

    def __init__(self, where: str, secret: str | None) -> None:
        self.where = where  # the site, for messages
        self._secret = secret

    def publish(self, item: PublishItem) -> Published:
        try:
            return self._publish(item)
        except (TrackerRefused, TrackerUnavailable):
            raise
        except Exception as exc:
            raise translated(exc, self.label, self.where, self._secret, self.errors) from None

    def _publish(self, item: PublishItem) -> Published:
        raise NotImplementedError

    def no_project(self, item: PublishItem) -> TrackerRefused:
        return TrackerRefused(f"{self.label} at {self.where} has no project named {item.show!r}")

    def may_create(self, item: PublishItem, what: str) -> None:
        """Refuses, naming ``what`` is missing, unless the item may create it."""
        if not item.create_missing:
            raise TrackerRefused(
                f"{self.label} at {self.where} has no {what} for {item.show}/{item.sequence}/"
                f"{item.shot} (set SVFX_PUBLISH_CREATE=true to create it)"
            )

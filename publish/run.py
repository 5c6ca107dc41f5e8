"""Publishing a job and recording what came of it: `publish_job` (``svfx publish``),
`publish_pending` (``--pending``: every pending publish again) and `publish_completed` (the
automatic publish of a job that just completed, which never fails the job).

A publish the tracker could not take (down, login refused, a shot it lacks, a name it
refuses) is recorded ``pending`` with the reason; a job already published to that tracker is
not published again (and the adapters find what they made, so a second publish of the same
version makes nothing new either)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from schemas.catalog import queries
from schemas.catalog.writer import Catalog
from schemas.settings import Settings, load_settings

from .adapters import open_tracker
from .errors import PublishError, PublishRefused, TrackerRefused, TrackerUnavailable
from .item import item_for_job
from .tracker import Tracker

log = logging.getLogger("svfx.publish")


@dataclass
class PublishOutcome:
    job_id: int
    tracker: str
    status: str  # published, pending, already published
    code: str = ""
    entity_ids: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def publish_job(
    catalog: Catalog,
    job_id: int,
    settings: Settings,
    *,
    tracker: Tracker | None = None,
    again: bool = False,
) -> PublishOutcome:
    """Publish the job to ``tracker`` (default: the one SVFX_PUBLISH names, connected here).
    Raises PublishRefused (unknown or incomplete job, no tracker configured); a tracker that
    cannot take it records the publish pending and answers it so (``reason``)."""
    start = time.perf_counter()
    name = tracker.name if tracker is not None else settings.publish
    item = item_for_job(catalog.engine, job_id, settings)
    if not name:
        open_tracker(settings)  # raises the refusal that names the setting
    done = [p for p in queries.job_publishes(catalog.engine, job_id) if p["tracker"] == name]
    if done and done[0]["status"] == "published" and not again:
        return PublishOutcome(
            job_id, name, "already published", done[0]["code"], done[0]["entity_ids"]
        )
    try:
        tracker = tracker or open_tracker(settings, name)
        published = tracker.publish(item)
    except (TrackerUnavailable, TrackerRefused, PublishRefused) as exc:
        # a setting missing is recorded too: --pending retries it once it is set
        catalog.record_publish(job_id, name, code=item.code, reason=exc.message)
        log.warning("publish of job %d to %s pending: %s", job_id, name, exc.message)
        outcome = PublishOutcome(job_id, name, "pending", item.code, reason=exc.message)
    else:
        catalog.record_publish(job_id, name, code=item.code, entity_ids=published.entity_ids)
        outcome = PublishOutcome(job_id, name, "published", item.code, published.entity_ids)
    outcome.seconds = time.perf_counter() - start
    return outcome


def publish_pending(
    catalog: Catalog, settings: Settings, *, tracker: Tracker | None = None
) -> list[PublishOutcome]:
    """Every pending publish (of ``tracker`` when given) tried again, oldest first; each
    tracker is connected once."""
    opened: dict[str, Tracker] = {tracker.name: tracker} if tracker is not None else {}
    failed: dict[str, str] = {}  # trackers that cannot be opened: why
    outcomes = []
    for pending in queries.pending_publishes(catalog.engine, tracker.name if tracker else None):
        job_id, name = pending["job_id"], pending["tracker"]
        if name not in opened and name not in failed:
            try:
                opened[name] = open_tracker(settings, name)
            except (TrackerUnavailable, PublishRefused) as exc:
                failed[name] = exc.message
        if name in failed:
            catalog.record_publish(job_id, name, code=pending["code"], reason=failed[name])
            outcomes.append(
                PublishOutcome(job_id, name, "pending", pending["code"], reason=failed[name])
            )
            continue
        outcomes.append(publish_job(catalog, job_id, settings, tracker=opened[name]))
    return outcomes


def publish_completed(
    catalog: Catalog, job_id: int, settings: Settings | None = None
) -> dict[str, str]:
    """The automatic publish of a job that completed, when SVFX_PUBLISH names a tracker:
    never raises (the job stays complete); anything that stops it is recorded pending with
    the reason. Returns what to note on the run's result (empty when not configured)."""
    try:
        settings = settings or load_settings()
    except Exception as exc:  # settings that do not load: said, the job stands
        return {"publish_error": f"the settings do not load: {exc}"}
    if not settings.publish:
        return {}
    key = f"publish_{settings.publish}"
    try:
        outcome = publish_job(catalog, job_id, settings)
    except PublishRefused as exc:
        return {key: f"not published: {exc.message}"}
    except PublishError as exc:  # pragma: no cover - every other publish error is recorded
        return {key: f"not published: {exc.message}"}
    except Exception as exc:  # a bug or an adapter's surprise: recorded, the job stands
        reason = f"{type(exc).__name__}: {exc}"
        log.exception("publish of job %d to %s failed", job_id, settings.publish)
        try:
            catalog.record_publish(job_id, settings.publish, code="", reason=reason)
        except Exception:
            log.exception("recording the failed publish of job %d", job_id)
        return {key: f"pending: {reason}"}
    if outcome.status == "pending":
        return {key: f"pending: {outcome.reason}"}
    return {key: f"{outcome.status}: {outcome.code} {outcome.entity_ids}"}

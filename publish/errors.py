"""Why a publish did not happen, each naming the job, tracker, setting or entity.

`TrackerUnavailable` (the tracker down, or refusing the login) and `TrackerRefused` (a shot or
name the tracker does not have or refuses) leave the publish recorded as pending with the
reason, so ``svfx publish --pending`` retries it; `PublishRefused` (a job that is not
complete, a tracker not configured) records nothing: there is nothing to retry."""

from __future__ import annotations

from core.errors import SvfxError


class PublishError(SvfxError):
    """Root of the publish errors."""


class PublishRefused(PublishError, ValueError):
    """Nothing to publish, or nothing to publish to: the job is unknown or not complete, no
    tracker is configured, a setting is missing."""


class TrackerUnavailable(PublishError, RuntimeError):
    """The tracker cannot be reached (down, timed out) or answers with a server error."""


class TrackerLoginRefused(TrackerUnavailable):
    """The tracker refuses the credentials (names the settings, never the secret)."""


class TrackerRefused(PublishError, ValueError):
    """The tracker lacks an entity the publish needs (a project, a shot when shots are not
    created) or refuses a name."""

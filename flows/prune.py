"""The scheduled prune: the ``prune-versions`` flow, `svfx prune --yes` on a schedule, and its
deployment, which ``svfx serve`` serves only when ``prune_interval_s`` is set (off by
default). It never forces: published versions and the sources of other versions stay."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from schemas.catalog import open_catalog
from schemas.catalog.queries.usage import human_bytes
from schemas.settings import Settings, load_settings
from tasks.deletion import delete
from tasks.prune import PruneRefused, PruneRules, parse_duration, plan_prune

PRUNE_DEPLOYMENT = "prune-versions"
REQUESTED_BY = "svfx serve (prune-versions)"


def rules_of(
    keep: int | None = None,
    older_than: str | None = None,
    invalidated: bool = False,
    show: str | None = None,
) -> PruneRules:
    """The flow's parameters as rules (PruneRefused naming a bad or missing one)."""
    span = None if older_than is None else parse_duration(older_than)
    return PruneRules(keep=keep, older_than=span, invalidated=invalidated, show=show)


@flow(name="prune-versions", log_prints=True)
def prune_versions(
    keep: int | None = None,
    older_than: str | None = None,
    invalidated: bool = False,
    show: str | None = None,
) -> dict[str, Any]:
    """Plan a prune by these rules (as `svfx prune`), log the plan, delete what it lists and
    log the bytes freed. Returns the versions deleted and kept, and the bytes freed."""
    logger = get_run_logger()
    rules = rules_of(keep, older_than, invalidated, show)
    settings = load_settings()
    catalog = open_catalog(settings.catalog, retry_s=settings.catalog_retry_s)
    plan = plan_prune(catalog.engine, settings, rules)
    lines = [f"prune {rules.describe()}: {len(plan.delete)} to delete, {len(plan.kept)} kept"]
    lines += [f"keep {i.version.name} {i.version.label}: {i.why}" for i in plan.kept]
    freed = 0
    for item in plan.delete:
        gone = delete(
            catalog, settings, item.version, requested_by=REQUESTED_BY, reason=plan.reason
        )
        freed += gone.size_bytes
        lines.append(
            f"deleted {item.version.name} {item.version.label} "
            f"({human_bytes(gone.size_bytes)}): {item.why}"
        )
    lines.append(f"{human_bytes(freed)} freed")
    for line in lines:
        logger.info(line)
    create_markdown_artifact(
        key="svfx-prune-report", markdown="\n".join(lines), description="prune"
    )
    return {
        "deleted": [f"{i.version.name} {i.version.label}" for i in plan.delete],
        "kept": [f"{i.version.name} {i.version.label}" for i in plan.kept],
        "size_bytes": freed,
    }


def prune_deployment(settings: Settings) -> Any | None:
    """The ``prune-versions`` deployment every ``prune_interval_s`` seconds, or None when that
    is not set; settings that make no rule are refused (PruneRefused), naming them."""
    if settings.prune_interval_s is None:
        return None
    parameters = {
        "keep": settings.prune_keep,
        "older_than": settings.prune_older_than,
        "invalidated": settings.prune_invalidated,
    }
    try:
        rules_of(**parameters)
    except PruneRefused as exc:
        raise PruneRefused(
            f"SVFX_PRUNE_INTERVAL_S is set but the prune's rules are not: {exc.message} "
            "(SVFX_PRUNE_KEEP, SVFX_PRUNE_OLDER_THAN, SVFX_PRUNE_INVALIDATED)"
        ) from None
    return prune_versions.to_deployment(
        name=PRUNE_DEPLOYMENT,
        tags=["svfx", "scheduled"],
        concurrency_limit=1,  # never two prunes at once
        parameters=parameters,
        interval=settings.prune_interval_s,
        description="svfx prune --yes on a schedule (never --force)",
    )

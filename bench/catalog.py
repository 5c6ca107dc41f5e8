"""A studio-sized catalog on PostgreSQL: filled through the catalog's writer, then timed.

Fills a database (``svfx_bench_<outputs>`` unless ``--database``) with a year of a mid-size
show scaled by ``--outputs`` (`bench.catalog_studio`: about one shot per 500 outputs and ten
jobs a shot, versions, resubmits, partial jobs with failed frames, stabilised versions linked
to their sources, flicker scores and publishes), recorded through ``Catalog`` as the flow
records it (`bench.catalog_record`) by ``--workers`` processes. Then times every read route of
the API (`bench.catalog_timing.ROUTES`) under ``--clients`` concurrent clients, the CLI's
``svfx catalog shots`` and ``svfx catalog outputs``, and the planning of a resubmit of the
largest shot (`bench.catalog_planning`), and prints a markdown table (``--json PATH`` writes
the figures).

The database is dropped at the end unless ``--keep``; a kept database of the same studio is
reused by the next run instead of being filled again.

    python -m bench.catalog --outputs 10000
    python -m bench.catalog --outputs 1000000 --keep --json /tmp/catalog-1m.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from bench.catalog_fill import FillResult, drop_database, fill
from bench.common import DEFAULT_PG_ADMIN


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--outputs", type=int, default=1_000_000, help="outputs to record")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--database", help="default: svfx_bench_<outputs>")
    p.add_argument("--pg", default=DEFAULT_PG_ADMIN, help="libpq URL of the server's admin db")
    p.add_argument("--keep", action="store_true", help="keep the database (and reuse it)")
    p.add_argument("--workers", type=int, default=2, help="processes recording the fill")
    p.add_argument("--chunk-frames", type=int, default=64, help="frames per recorded chunk")
    p.add_argument("--requests", type=int, default=50, help="timed requests per route")
    p.add_argument("--clients", type=int, default=8, help="concurrent API clients")
    p.add_argument("--repeats", type=int, default=3, help="runs of each CLI command and plan")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--only", help="time only the routes whose name has this text (no CLI, plan)")
    args = p.parse_args(argv)
    if args.outputs < 1000:
        p.error(f"--outputs {args.outputs}: at least 1000 (two shots)")
    args.database = args.database or f"svfx_bench_{args.outputs}"
    return args


def fill_line(result: FillResult) -> str:
    what = f"{result.outputs:,} outputs, {result.jobs:,} jobs, {result.shots:,} shots"
    rate = (
        f"{result.seconds:.0f} s: {result.outputs_per_s:,.0f} outputs/s, "
        f"{result.jobs_per_s:.1f} jobs/s ({result.workers} processes)"
    )
    if result.reused:
        return f"reused the kept fill of {what} (filled in {rate})"
    return f"filled {what} through the writer in {rate}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| what | p50 ms | p95 ms | max ms | n | status | asked |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        status = ",".join(str(s) for s in r["status"])
        lines.append(
            f"| {r['what']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['max']:.1f} | {r['n']} "
            f"| {status} | `{r['path'][:90]}` |"
        )
    return "\n".join(lines)


def measure(args: argparse.Namespace, url: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every timed row over the filled catalog at ``url``, and the GET routes not timed."""
    from api.app import create_app
    from bench.api import served
    from bench.catalog_planning import time_planning
    from bench.catalog_studio import studio
    from bench.catalog_timing import ROUTES, targets, time_cli, time_routes, uncovered
    from schemas.catalog import open_catalog
    from schemas.settings import Settings

    catalog = open_catalog(url)
    found = targets(catalog.engine)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp) / "home", catalog_url=url, allowed_roots=[tmp])
        missing = uncovered(create_app(settings, engine=catalog.engine), found)
        if missing:
            print(f"not timed (no row in ROUTES asks them): {', '.join(missing)}")
        routes = tuple(r for r in ROUTES if args.only is None or args.only in r[0])
        with served(url, Path(tmp)) as base:
            rows = time_routes(base, found, args.requests, args.clients, routes)
    if args.only is None:
        rows += time_cli(url, found.shot, args.repeats)
        largest = next(s for s in studio(args.outputs, args.seed) if s.path == found.shot)
        rows += time_planning(url, largest, args.repeats)
    catalog.close()
    return rows, missing


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    result = fill(args.pg, args.database, args.outputs, args.seed, args.workers, args.chunk_frames)
    print(fill_line(result))
    try:
        rows, missing = measure(args, result.url)
    finally:
        if not args.keep:
            drop_database(args.pg, args.database)
    print()
    print(f"{args.outputs:,} outputs asked, {result.outputs:,} recorded; "
          f"{args.clients} concurrent clients, {args.requests} requests a route")  # fmt: skip
    print(table(rows))
    if args.json is not None:
        facts = {"outputs": args.outputs, "clients": args.clients, "requests": args.requests}
        fill_facts = {k: getattr(result, k) for k in ("reused", "outputs", "jobs", "shots",
                                                        "seconds", "workers")}  # fmt: skip
        fill_facts.update(outputs_per_s=result.outputs_per_s, jobs_per_s=result.jobs_per_s)
        found = {**facts, "fill": fill_facts, "rows": rows, "not_timed": missing}
        args.json.write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()

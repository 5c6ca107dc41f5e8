"""How long a publish of a completed job takes: building what it makes from the catalog,
then publishing to ShotGrid's double (mockgun, in process: our side of the work alone) and,
with ``--kitsu``, to a real local Kitsu (zou on gunicorn, PostgreSQL and Redis on loopback,
as tests/kitsu_server.py starts it): the first publish (comment, preview upload, thumbnail,
output files) and a second one of the same job (found, nothing made).

    svfx demo                                   # a complete job under $SVFX_HOME
    python -m bench.publish --home ~/.svfx [--job N] [--kitsu] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from publish.item import item_for_job
from publish.run import publish_job
from publish.shotgrid import ShotGridTracker
from schemas.catalog import open_catalog, queries
from schemas.settings import Settings


def timed(step: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The median wall time of ``repeat`` runs of ``step`` (s), and its last answer."""
    times, answer = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        answer = step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), answer


def newest_complete_job(settings: Settings) -> int:
    jobs, _ = queries.jobs_page(open_catalog(settings.catalog).engine, status="complete", limit=1)
    if not jobs:
        raise SystemExit(f"no complete job in {settings.catalog}: run `svfx demo` first")
    return int(jobs[0]["id"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="SVFX_HOME of the job")
    parser.add_argument("--job", type=int, help="the job (default: the newest complete one)")
    parser.add_argument("--kitsu", action="store_true", help="also a real local Kitsu")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    from tests.publish_helpers import mockgun

    settings = Settings(home=args.home, publish_create=True)
    catalog = open_catalog(settings.catalog)
    job = args.job or newest_complete_job(settings)
    item_s, item = timed(lambda: item_for_job(catalog.engine, job, settings), args.repeat)
    print(f"job {job}: {item.code}, frames {item.frame_range}, review pass {item.review_pass}")
    sizes = {
        "clip": Path(item.movie.uri).stat().st_size if item.movie else 0,
        "contact sheet": Path(item.thumbnail.uri).stat().st_size if item.thumbnail else 0,
    }
    print(f"item from the catalog: {item_s * 1000:.1f} ms; files {sizes}")

    def shotgrid_first() -> Any:
        return publish_job(catalog, job, settings, tracker=ShotGridTracker(mockgun(), "m"),
                           again=True)  # fmt: skip

    first_s, _ = timed(shotgrid_first, args.repeat)
    tracker = ShotGridTracker(mockgun(), "m")
    publish_job(catalog, job, settings, tracker=tracker, again=True)
    again_s, _ = timed(
        lambda: publish_job(catalog, job, settings, tracker=tracker, again=True), args.repeat
    )
    print(
        f"ShotGrid (mockgun): first publish {first_s * 1000:.1f} ms, again {again_s * 1000:.1f} ms"
    )
    if args.kitsu:
        kitsu(catalog, job, settings, args.repeat)


def kitsu(catalog: Any, job: int, settings: Settings, repeat: int) -> None:
    import gazu
    from pydantic import SecretStr

    from publish.kitsu import connect
    from tests.kitsu_server import kitsu_server

    start = time.perf_counter()
    server = kitsu_server()
    k = next(server)
    print(
        f"Kitsu server up (fresh PostgreSQL, Redis, zou init): {time.perf_counter() - start:.1f} s"
    )
    try:
        admin = gazu.client.create_client(k.host)
        gazu.log_in(k.email, k.password, client=admin)
        gazu.project.new_project("demo", production_style="vfx", client=admin)
        use = settings.model_copy(
            update={
                "kitsu_host": k.host,
                "kitsu_email": k.email,
                "kitsu_password": SecretStr(k.password),
            }
        )
        login_s, tracker = timed(lambda: connect(use), 1)
        first_s, outcome = timed(lambda: publish_job(catalog, job, use, tracker=tracker,
                                                     again=True), 1)  # fmt: skip
        again_s, _ = timed(
            lambda: publish_job(catalog, job, use, tracker=tracker, again=True), repeat
        )
        print(f"Kitsu: login {login_s * 1000:.0f} ms, first publish {first_s * 1000:.0f} ms "
              f"({outcome.status}), again {again_s * 1000:.0f} ms")  # fmt: skip
    finally:
        server.close()


if __name__ == "__main__":
    main()

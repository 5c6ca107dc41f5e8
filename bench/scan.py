"""How long a bucket scan takes, and what it asks of the store.

Fills a moto S3 server on loopback with SHOTS x FRAMES plate objects under the naming
template, then times three scans against a catalog (SQLite by default; PostgreSQL with
``--postgres``):

1. everything new (empty catalog; a dry run, so nothing is processed);
2. nothing new (the catalog knows every frame as read with its ETag);
3. one frame of one shot re-uploaded.

For each: wall time, sequences by decision, and the S3 requests the scan made by operation
(counted with botocore's before-call event on the scan's own client). Target (issue 5): under
10 s for 200 x 100, and a scan with nothing new issues nothing but the listing.

    python -m bench.scan                       # 200 shots x 100 frames, SQLite
    python -m bench.scan --postgres           # the catalog on the local PostgreSQL server
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_PG_ADMIN, free_port, full_frame_plate, pg_database

TEMPLATE = "{show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"


class RequestCounter:
    """S3 operations made through one s3fs filesystem (its aiobotocore client's events)."""

    def __init__(self, fs: Any) -> None:
        self.calls: Counter[str] = Counter()
        fs.connect()
        fs.s3.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any = None, **_: Any) -> None:
        self.calls[model.name if model is not None else "?"] += 1

    def take(self) -> dict[str, int]:
        calls = dict(self.calls)
        self.calls.clear()
        return calls


def fill_bucket(bucket: str, shots: int, frames: int) -> None:
    """Straight into the in-process moto server's backend: 20,000 PUTs over HTTP take minutes
    and are not what is measured."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    partitions = s3_backends[DEFAULT_ACCOUNT_ID]
    backend = partitions["aws"] if "aws" in partitions else partitions["global"]
    for s in range(shots):
        for f in range(1001, 1001 + frames):
            key = f"show{s % 4}/sq{s // 10:03d}/sh{s:04d}/plates/bg01/p.{f}.exr"
            backend.put_object(bucket, key, f"{s}:{f}".encode())


def know_everything(catalog: Any, report: Any, sequences: list[Any]) -> None:
    """Record every listed frame as read with its size and ETag, as a finished run would."""
    from sqlalchemy import update

    from schemas.catalog.models import PlateFrame

    found = {sequence.plate: sequence for sequence in sequences}
    for decision in report.sequences:
        objects = found[decision.plate].frames
        fingerprints = {f: (obj.size, obj.fingerprint) for f, obj in objects.items()}
        info = full_frame_plate(
            decision.plate, sorted(objects), (64, 64), "lin_rec709", fingerprints=fingerprints
        )
        job = catalog.register_job(decision.spec, info)
        catalog.finish_job(job, "complete")
    with catalog.engine.begin() as conn:
        conn.execute(update(PlateFrame).values(sha256="0" * 64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shots", type=int, default=200)
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_PG_ADMIN,
        default=None,
        help="catalog in a throwaway database on this PostgreSQL server (default: SQLite)",
    )
    args = parser.parse_args()

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    import s3fs
    from moto.server import ThreadedMotoServer

    from schemas.settings import Settings

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        work = Path(tempfile.mkdtemp(prefix="svfx-bench-scan-"))
        settings = Settings(home=work, s3_endpoint_url=endpoint)
        url = "s3://bench-plates"
        loader = s3fs.S3FileSystem(
            client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
        )
        loader.mkdir("bench-plates")
        t0 = time.perf_counter()
        fill_bucket("bench-plates", args.shots, args.frames)
        print(f"uploaded {args.shots * args.frames} objects in {time.perf_counter() - t0:.1f} s")

        with contextlib.ExitStack() as stack:
            url_db = (
                stack.enter_context(pg_database(args.postgres, "svfx_bench_scan"))
                if args.postgres
                else f"sqlite:///{work / 'catalog.db'}"
            )
            run(url, url_db, settings, loader, args)
    finally:
        server.stop()


def run(url: str, catalog_url: str, settings: Any, loader: Any, args: Any) -> None:
    from flows.plate_template import PlateTemplate
    from flows.scan import ScanDefaults, ScanReport, find_sequences, scan_bucket
    from schemas.catalog import open_catalog

    catalog = open_catalog(catalog_url)
    scan_fs, _ = settings.location(url).fs_and_path()
    counter = RequestCounter(scan_fs)

    class NoSubmit:
        def in_flight(self) -> dict[str, str]:
            return {}

        def submit(self, spec: Any, *, reason: str) -> str:
            raise AssertionError("the bench never submits")

    def scan(label: str, dry_run: bool) -> Any:
        start = time.perf_counter()
        report = scan_bucket(
            [url],
            TEMPLATE,
            catalog=catalog,
            submitter=NoSubmit(),
            settings=settings,
            defaults=ScanDefaults(settle_seconds=0, max_in_flight=10**6),
            dry_run=dry_run,
        )
        seconds = time.perf_counter() - start
        rows.append((label, seconds, report.counts(), counter.take()))
        return report

    rows: list[tuple[str, float, dict[str, int], dict[str, int]]] = []
    first = scan("all new (dry run)", dry_run=True)
    # the objects as the scan saw them (a listing of the bench's own, not counted)
    listed = find_sequences(
        [url], PlateTemplate.parse(TEMPLATE), settings, ScanReport([url], "", True)
    )
    counter.take()
    know_everything(catalog, first, listed)
    scan("nothing new", dry_run=True)
    loader.pipe({"bench-plates/show1/sq000/sh0001/plates/bg01/p.1050.exr": b"re-pulled"})
    changed = scan("one frame re-uploaded (dry run)", dry_run=True)
    (redo,) = [d for d in changed.sequences if d.action == "changed"]
    assert redo.redo == [1050], redo

    print(
        f"\n{args.shots} shots x {args.frames} frames on moto, catalog "
        f"{catalog.engine.dialect.name}\n"
    )
    print("| scan | seconds | sequences | S3 requests |")
    print("|---|---|---|---|")
    for label, seconds, counts, calls in rows:
        decided = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        requests = ", ".join(f"{v} {k}" for k, v in sorted(calls.items()))
        print(f"| {label} | {seconds:.2f} | {decided} | {requests} |")
    catalog.close()


if __name__ == "__main__":
    main()

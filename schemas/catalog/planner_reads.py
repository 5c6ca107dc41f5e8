"""The writer's part for what the planner and the bucket scan ask before work starts: the
plate frames last recorded and the newest outputs of a shot. Read through the writer's
engine, so they retry through outages as its writes do."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, select

from schemas.catalog.queries.by_shot import with_shot
from schemas.catalog.transactions import CatalogTransactions
from schemas.catalog.upserts import OUTPUTS, PLATE_FRAMES, PLATES
from schemas.catalog.uris import normalise_uri
from schemas.passes import OUTPUT_KINDS


class PlannerReads(CatalogTransactions):
    """Plate frames and outputs as recorded (a part of ``schemas.catalog.writer.Catalog``)."""

    def known_plate_frames(
        self, show: str, sequence: str, shot: str, pattern: str
    ) -> dict[int, tuple[int | None, str | None, str | None]]:
        """frame -> (size, fingerprint, sha256) as last recorded for this plate: frames whose
        fingerprint still matches need no re-hashing."""
        pf = PLATE_FRAMES.c
        stmt = select(pf.frame, pf.size_bytes, pf.fingerprint, pf.sha256).select_from(
            PLATE_FRAMES.join(PLATES, PLATES.c.id == pf.plate_id)
        )
        stmt = with_shot(stmt, PLATES.c.shot_id, show, sequence, shot)
        stmt = stmt.where(PLATES.c.pattern == normalise_uri(pattern))
        return self._read(
            lambda conn: {
                r.frame: (r.size_bytes, r.fingerprint, r.sha256) for r in conn.execute(stmt)
            },
            f"reading the plate frames of {show}/{sequence}/{shot}",
        )

    def plate_frame_states(
        self, patterns: Iterable[str]
    ) -> dict[str, dict[int, tuple[int | None, str | None, bool]]]:
        """For the bucket scan, in one query per 500 plates: normalised pattern -> frame ->
        (size, fingerprint, read), where ``read`` says a worker has read the bytes with that
        fingerprint (its checksum is recorded; a changed fingerprint clears it)."""
        wanted = sorted({normalise_uri(p) for p in patterns})
        pf = PLATE_FRAMES.c
        states: dict[str, dict[int, tuple[int | None, str | None, bool]]] = {}

        def work(conn: Connection) -> None:
            for start in range(0, len(wanted), 500):
                stmt = (
                    select(PLATES.c.pattern, pf.frame, pf.size_bytes, pf.fingerprint, pf.sha256)
                    .select_from(PLATE_FRAMES.join(PLATES, PLATES.c.id == pf.plate_id))
                    .where(PLATES.c.pattern.in_(wanted[start : start + 500]))
                )
                for r in conn.execute(stmt):
                    frames = states.setdefault(r.pattern, {})
                    frames[r.frame] = (r.size_bytes, r.fingerprint, r.sha256 is not None)

        self._read(work, "comparing plates")
        return states

    def existing_outputs(
        self, show: str, sequence: str, shot: str, kind: str = "exr", uri_prefix: str = ""
    ) -> dict[tuple[int, str], str]:
        """(frame, pass) -> cache key of the newest output of that kind (under ``uri_prefix``,
        the output folder of one element and version, when given)."""
        newest = self.frame_outputs(show, sequence, shot, uri_prefix, kinds=(kind,))
        return {(frame, name): row["cache_key"] for (frame, _, name), row in newest.items()}

    def frame_outputs(
        self,
        show: str,
        sequence: str,
        shot: str,
        uri_prefix: str = "",
        kinds: tuple[str, ...] = OUTPUT_KINDS,
    ) -> dict[tuple[int, str, str], dict[str, Any]]:
        """(frame, kind, pass) -> the newest output row on disk (uri, size_bytes, sha256,
        cache_key) under ``uri_prefix`` (one element's and version's folder, when given)."""
        o = OUTPUTS.c
        stmt = select(o.frame, o.kind, o.pass_name, o.uri, o.size_bytes, o.sha256, o.cache_key)
        stmt = with_shot(stmt.select_from(OUTPUTS), o.shot_id, show, sequence, shot)
        stmt = stmt.where(o.kind.in_(kinds), o.deletion_id.is_(None)).order_by(o.created_at, o.id)
        if uri_prefix:
            prefix = normalise_uri(uri_prefix.rstrip("/")) + "/"
            stmt = stmt.where(o.uri.startswith(prefix, autoescape=True))

        def work(conn: Connection) -> dict[tuple[int, str, str], dict[str, Any]]:
            # ascending order: the newest row for a (frame, kind, pass) is written last and wins
            return {(r.frame, r.kind, r.pass_name): dict(r._mapping) for r in conn.execute(stmt)}

        return self._read(work, f"reading the outputs of {show}/{sequence}/{shot}")

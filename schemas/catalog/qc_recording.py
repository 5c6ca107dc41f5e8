"""The writer's part for the shot's temporal QC: the flicker score of each output."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, bindparam, update

from schemas.catalog.transactions import CatalogTransactions
from schemas.catalog.upserts import OUTPUTS, lock_job
from schemas.catalog.uris import normalise_uri


class QcRecording(CatalogTransactions):
    """Record flicker scores (a part of ``schemas.catalog.writer.Catalog``)."""

    def record_flicker(
        self,
        job_id: int,
        flicker: Mapping[str, Mapping[int, float]],
        uris: Mapping[int, Iterable[str]],
        method: str,
    ) -> int:
        """Set the temporal QC score of each (pass, frame) on that frame's outputs among
        ``uris`` (its EXR and the shot's Zarr store) in the job's shot, with the ``method``
        that made it (``tasks.temporal_qc.METHOD``); returns the rows set."""
        rows = [
            {"p": name, "f": frame, "u": normalise_uri(uri), "score": float(score)}
            for name, scores in flicker.items()
            for frame, score in scores.items()
            for uri in uris.get(frame, ())
        ]

        def work(conn: Connection) -> int:
            shot_id, _plate_id = lock_job(conn, job_id)
            if not rows:
                return 0
            stmt = (
                update(OUTPUTS)
                .where(
                    OUTPUTS.c.shot_id == shot_id,
                    OUTPUTS.c.pass_name == bindparam("p"),
                    OUTPUTS.c.frame == bindparam("f"),
                    OUTPUTS.c.uri == bindparam("u"),
                )
                .values(flicker=bindparam("score"), flicker_method=method)
            )
            return int(conn.execute(stmt, rows).rowcount or 0)

        return self._write(work, f"recording the flicker scores of job {job_id}")

"""The shot a route is about, named by its path (show/sequence/shot): ``KnownShot`` is the one
dependency that checks the catalog has it, and refuses with a 404 Problem before the route
runs when it does not (``UnknownShot``; the pages answer it with their own 404 page).

FastAPI runs dependencies before it checks a route's own query parameters, so an unknown shot
is a 404 whatever else the query says (a bad path parameter is still a 422)."""

from __future__ import annotations

from typing import Annotated, NamedTuple

from fastapi import Depends, HTTPException

from api.context import ApiContext, context
from api.params import SequencePath, ShotPath, ShowPath
from schemas.catalog import queries


class ShotKey(NamedTuple):
    """A shot by its names; unpacks as (show, sequence, shot) for the queries."""

    show: str
    sequence: str
    shot: str

    def __str__(self) -> str:
        return f"{self.show}/{self.sequence}/{self.shot}"


class UnknownShot(HTTPException):
    """404: the catalog has no such shot."""

    def __init__(self, key: ShotKey) -> None:
        super().__init__(404, f"the catalog has no shot {key}")
        self.key = key


def known_shot(
    ctx: Annotated[ApiContext, Depends(context)],
    show: ShowPath,
    sequence: SequencePath,
    shot: ShotPath,
) -> ShotKey:
    """FastAPI dependency: the path's shot, if the catalog has it (else UnknownShot)."""
    key = ShotKey(show, sequence, shot)
    if not queries.shot_exists(ctx.engine, show, sequence, shot):
        raise UnknownShot(key)
    return key


KnownShot = Annotated[ShotKey, Depends(known_shot)]

"""Images for the pages, never by a caller's path: a preview output by its catalog id, or a
pass's contact sheet at the place ShotOutputPaths gives for the shot's newest job.

What is served must be what the catalog means. A local file's real path (every symlink
resolved) must lie under the real allowed roots; it is opened one folder at a time without
following a link, and must be a regular file. Its bytes must be the image type its name says
(JPEG or PNG) and, for a catalogued preview, hash to the sha256 the catalog recorded. An
``s3://`` object (no links there) must lie under an allowed prefix and pass the same byte
checks. Anything else is a 404 that says why."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Response

from api.context import ApiContext, context
from api.params import OutputIdPath, PassPath, SequencePath, ShotPath, ShowPath
from api.problems import INVALID
from api.responses import Problem
from schemas.catalog import queries
from schemas.passes import DEFAULT_FAMILY, DEFAULT_PASSES, job_family
from schemas.settings import Settings
from schemas.spec import NAME, is_under
from storage.uri import split_scheme
from tasks.output_paths import ShotOutputPaths

router = APIRouter(prefix="/files", tags=["files"], responses=INVALID)
Ctx = Annotated[ApiContext, Depends(context)]
IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
SIGNATURES = {"image/jpeg": b"\xff\xd8\xff", "image/png": b"\x89PNG\r\n\x1a\n"}
MAX_IMAGE_BYTES = 64 * 2**20  # previews and contact sheets are far smaller
SERVED_KINDS = ("preview",)
JOBS_SEARCHED = 20  # newest jobs looked at for one that made the pass
_VERSION = re.compile(r"^v\d{3,4}$")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


class Unservable(Exception):
    """Why an image is not served (the 404's detail says it)."""


@dataclass(frozen=True)
class Image:
    data: bytes
    media_type: str


def media_type(uri: str) -> str | None:
    """The image type of ``uri`` by its suffix, or None for anything that is not served."""
    name = uri.rsplit("/", 1)[-1].lower()
    return next((kind for ext, kind in IMAGE_TYPES.items() if name.endswith(ext)), None)


def local_path(uri: str) -> str | None:
    """The local path of ``uri`` (a path or file://), or None for a remote URI (s3://)."""
    scheme, rest = split_scheme(uri)
    if scheme is None:
        return os.path.expanduser(uri)
    return rest if scheme.lower() == "file" else None


def real_path(path: str) -> str:
    """``path`` with every symlink resolved; Unservable for a path the OS cannot take."""
    try:
        return os.path.realpath(path)
    except (ValueError, OSError) as exc:  # NUL in the name, a link loop
        raise Unservable(f"its path cannot be resolved ({exc})") from None


def real_roots(settings: Settings) -> list[str]:
    """The local allowed roots with their symlinks resolved."""
    paths = (local_path(root) for root in settings.roots)
    return [real_path(path) for path in paths if path is not None]


def is_within(real: str, roots: list[str]) -> bool:
    return any(os.path.commonpath([real, root]) == root for root in roots)


def located(settings: Settings, uri: str) -> str:
    """Where ``uri`` is read from if it may be served (by name and place, nothing read): the
    real local path under a real allowed root, or the remote URI under an allowed prefix."""
    if media_type(uri) is None:
        raise Unservable("its name does not end in .jpg, .jpeg or .png")
    path = local_path(uri)
    if path is None:
        if not any(is_under(uri, root) for root in settings.roots):
            raise Unservable("it lies outside the allowed roots")
        return uri
    real = real_path(path)
    if not is_within(real, real_roots(settings)):
        raise Unservable("its real path (symlinks resolved) lies outside the allowed roots")
    return real


def servable(settings: Settings, uri: str) -> bool:
    """Whether ``uri`` may be served by name and place (its bytes are checked when read)."""
    try:
        located(settings, uri)
    except Unservable:
        return False
    return True


def _open_without_links(real: str) -> int:
    """A read-only descriptor of the absolute, resolved path ``real``, opened one component at
    a time with O_NOFOLLOW: a folder or file swapped for a link after the root check is
    refused instead of followed."""
    *folders, name = real.split("/")[1:]
    fd = os.open("/", _DIRECTORY)
    try:
        for folder in folders:
            inner = os.open(folder, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(name, _FILE, dir_fd=fd)
    finally:
        os.close(fd)


def _read_local(real: str) -> bytes:
    try:
        fd = _open_without_links(real)
    except FileNotFoundError:
        raise Unservable("it is missing") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unservable("a symlink is on its path (links are not followed)") from None
        raise Unservable(f"it cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Unservable("it is not a regular file")
        if info.st_size > MAX_IMAGE_BYTES:
            raise Unservable(f"it is larger than {MAX_IMAGE_BYTES} bytes")
        return file.read(MAX_IMAGE_BYTES + 1)


def _read_remote(settings: Settings, uri: str) -> bytes:
    fs, path = settings.location(uri).fs_and_path()
    try:
        with fs.open(path, "rb") as file:
            return bytes(file.read(MAX_IMAGE_BYTES + 1))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise Unservable("it is missing") from None
    except OSError as exc:
        raise Unservable(f"it cannot be read ({exc})") from None


def _checked(data: bytes, kind: str, sha256: str | None) -> Image:
    """``data`` if its bytes are a ``kind`` image (and hash to ``sha256`` when given)."""
    if len(data) > MAX_IMAGE_BYTES:
        raise Unservable(f"it is larger than {MAX_IMAGE_BYTES} bytes")
    if not data.startswith(SIGNATURES[kind]):
        raise Unservable(f"its bytes are not {kind}, as its name says")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256.lower():
        raise Unservable("its bytes changed since it was catalogued (sha256 differs)")
    return Image(data, kind)


def read_servable_image(settings: Settings, uri: str, sha256: str | None = None) -> Image:
    """The image at ``uri`` after every check in the module docstring; Unservable says why
    it is refused. ``sha256``: what the catalog recorded for the file."""
    where = located(settings, uri)
    kind = media_type(uri) or ""
    data = _read_local(where) if local_path(uri) is not None else _read_remote(settings, where)
    return _checked(data, kind, sha256)


def image_exists(settings: Settings, uri: str) -> bool:
    """Whether ``uri`` may be served and is a file (its bytes are checked when read)."""
    try:
        where = located(settings, uri)
    except Unservable:
        return False
    if local_path(uri) is not None:
        return os.path.isfile(where)
    fs, path = settings.location(where).fs_and_path()
    return bool(fs.isfile(path))


def contact_sheet_uri(
    jobs: list[dict[str, Any]],
    settings: Settings,
    show: str,
    sequence: str,
    shot: str,
    pass_name: str,
) -> str | None:
    """Where the newest of ``jobs`` (newest first) that made ``pass_name`` wrote its contact
    sheet, by ShotOutputPaths from the job's spec (None: no such job)."""
    for job in jobs:
        spec = job["spec"]
        version = str(spec.get("version") or "v001")
        if pass_name in (spec.get("passes") or ()) and _VERSION.match(version):
            root = str(spec.get("output_root") or settings.outputs)
            element = spec.get("element")
            if element is not None and not NAME.match(str(element)):
                continue  # never build a path from a name the spec would refuse
            family = job_family(
                spec.get("passes") or DEFAULT_PASSES, spec.get("family") or DEFAULT_FAMILY
            )
            paths = ShotOutputPaths.for_shot(
                root, show, sequence, shot, version, element=element, family=family
            )
            return paths.contact_sheet(pass_name)
    return None


IMAGE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/jpeg": {}, "image/png": {}}, "description": "the image"},
}
NOT_SERVED: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "unknown, or not served (the detail says why)"},
}


@router.get(
    "/outputs/{output_id}",
    summary="A preview image by its catalog id",
    response_class=Response,
    responses={
        **IMAGE,
        304: {"description": "unchanged since the ETag sent in If-None-Match"},
        **NOT_SERVED,
    },
)
def output_image(
    ctx: Ctx,
    output_id: OutputIdPath,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The preview's bytes, only when they are still what the catalog recorded."""
    found = queries.output_file(ctx.engine, output_id)
    if found is None or found["kind"] not in SERVED_KINDS:
        raise HTTPException(404, f"no preview image with id {output_id}")
    try:
        image = read_servable_image(ctx.settings, found["uri"], found["sha256"])
    except Unservable as exc:
        raise HTTPException(404, f"preview {output_id} is not served: {exc}") from None
    etag = f'"{found["sha256"]}"'
    headers = {"ETag": etag, **_HEADERS}
    if if_none_match == etag:
        return Response(status_code=304, headers=headers)
    return Response(image.data, media_type=image.media_type, headers=headers)


@router.get(
    "/contact/{show}/{sequence}/{shot}/{pass_name}",
    summary="A pass's contact sheet (newest job that made it)",
    response_class=Response,
    responses={**IMAGE, **NOT_SERVED},
)
def contact_sheet(
    ctx: Ctx, show: ShowPath, sequence: SequencePath, shot: ShotPath, pass_name: PassPath
) -> Response:
    jobs, _ = queries.jobs_page(ctx.engine, show, sequence, shot, limit=JOBS_SEARCHED)
    uri = contact_sheet_uri(jobs, ctx.settings, show, sequence, shot, pass_name)
    missing = f"no {pass_name} contact sheet for {show}/{sequence}/{shot}"
    if uri is None:
        raise HTTPException(404, missing)
    try:
        image = read_servable_image(ctx.settings, uri)
    except Unservable as exc:
        raise HTTPException(404, f"{missing}: {exc}") from None
    return Response(image.data, media_type=image.media_type, headers=_HEADERS)

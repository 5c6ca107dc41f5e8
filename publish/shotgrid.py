"""ShotGrid (Flow Production Tracking) through ``shotgun_api3``, with Toolkit's field names:
a ``Version`` on the shot, under its task (``code``, ``entity``, ``sg_task``,
``description``, ``sg_path_to_frames`` with ``%04d``, ``sg_first_frame``,
``sg_last_frame``, ``frame_range``, ``sg_path_to_movie``; the review clip uploaded to
``sg_uploaded_movie`` and the contact sheet as its thumbnail), and a ``PublishedFile`` per
file (``code``, ``name``, ``version_number``, ``path``: a local path under one of the
site's LocalStorages, else a ``file://`` link, as Toolkit's ``register_publish`` does;
``published_file_type``, ``entity``, ``task``, ``version``).

Entities are found before anything is made: the Version by code on the shot, each
PublishedFile by code on the Version, so a second publish makes nothing new. A missing
sequence, shot or task is created with ``SVFX_PUBLISH_CREATE=true``, else refused by name;
a missing project is always refused. ``shotgun_api3`` is imported only here (tests hand a
mockgun connection to `ShotGridTracker`)."""

from __future__ import annotations

import socket
from typing import Any

from schemas.settings import Settings, secret
from storage.uri import is_remote

from .errors import PublishRefused
from .item import PublishedFile, PublishItem
from .local_files import local_path
from .tracker import ClientErrors, Published, TrackerAdapter, login_settings, translated

FILE_TYPES = {"exr": "EXR Sequence", "zarr": "Zarr Store", "nuke": "Nuke Script"}
ERRORS = ClientErrors(  # shotgun_api3's (and mockgun's) exceptions
    login=frozenset({"AuthenticationFault"}),
    login_settings="SVFX_SHOTGRID_SCRIPT and SVFX_SHOTGRID_SCRIPT_KEY",
    unavailable=frozenset({"ProtocolError", "ResponseError"}),
    unavailable_types=(OSError, socket.timeout),
    refused=frozenset({"Fault", "ShotgunError", "MockgunError"}),
)


class ShotGridTracker(TrackerAdapter):
    name = "shotgrid"
    label = "ShotGrid"
    errors = ERRORS

    def __init__(self, sg: Any, where: str, key: str | None = None) -> None:
        super().__init__(where, key)
        self.sg = sg
        self._storages: list[dict[str, Any]] | None = None  # the site's LocalStorages

    def _publish(self, item: PublishItem) -> Published:
        sg = self.sg
        project = sg.find_one("Project", [["name", "is", item.show]], ["name"])
        if project is None:
            raise self.no_project(item)
        project = _link(project)
        sequence = self._find_or_create(
            "Sequence", [["project", "is", project], ["code", "is", item.sequence]],
            {"project": project, "code": item.sequence}, item,
        )  # fmt: skip
        shot = self._find_or_create(
            "Shot", [["project", "is", project], ["code", "is", item.shot]],
            {"project": project, "code": item.shot, "sg_sequence": sequence}, item,
        )  # fmt: skip
        task = self._find_or_create(
            "Task", [["entity", "is", shot], ["content", "is", item.task]],
            {"project": project, "entity": shot, "content": item.task}, item,
        )  # fmt: skip
        ids: dict[str, Any] = {
            "project": project["id"],
            "sequence": sequence["id"],
            "shot": shot["id"],
            "task": task["id"],
        }
        version = sg.find_one("Version", [["entity", "is", shot], ["code", "is", item.code]])
        created = version is None
        if version is None:
            version = _link(sg.create("Version", self._version_fields(item, project, shot, task)))
            if item.movie is not None:
                with local_path(item.movie) as movie:
                    sg.upload("Version", version["id"], movie, field_name="sg_uploaded_movie")
            if item.thumbnail is not None:
                with local_path(item.thumbnail) as thumbnail:
                    sg.upload_thumbnail("Version", version["id"], thumbnail)
        ids["version"] = version["id"]
        ids["published_files"] = [
            self._published_file(item, f, project, shot, task, _link(version))["id"]
            for f in item.files
        ]
        return Published(ids, created=created)

    def _version_fields(self, item: PublishItem, project: Any, shot: Any, task: Any) -> Any:
        exr = next((f.path for f in item.files if f.kind == "exr"), None)
        return {
            "project": project,
            "code": item.code,
            "entity": shot,
            "sg_task": task,
            "description": item.comment,
            "sg_status_list": "rev",
            "sg_path_to_frames": _local(exr),
            "sg_first_frame": item.first_frame,
            "sg_last_frame": item.last_frame,
            "frame_count": item.last_frame - item.first_frame + 1,
            "frame_range": item.frame_range,
            "sg_path_to_movie": _local(item.movie.uri) if item.movie else None,
        }

    def _published_file(
        self, item: PublishItem, f: PublishedFile, project: Any, shot: Any, task: Any, version: Any
    ) -> Any:
        code = f.path.rsplit("/", 1)[-1]
        mine = [["version", "is", version], ["code", "is", code]]
        found = self.sg.find_one("PublishedFile", mine)
        if found is not None:
            return found
        kind = FILE_TYPES[f.kind]
        file_type = self.sg.find_one("PublishedFileType", [["code", "is", kind]])
        if file_type is None:  # as Toolkit's register_publish: types are made on first use
            file_type = self.sg.create("PublishedFileType", {"code": kind})
        return self.sg.create(
            "PublishedFile",
            {
                "project": project,
                "code": code,
                "name": f.name,
                "version_number": item.version_number,
                "path": self._path(f.path),
                "published_file_type": _link(file_type),
                "entity": shot,
                "task": task,
                "version": version,
                "description": item.comment,
            },
        )

    def _path(self, uri: str) -> dict[str, Any]:
        """The ``path`` of a PublishedFile as Toolkit writes it: a local path when a
        LocalStorage of the site holds it, else a ``file://`` link (an ``s3://`` link as
        is)."""
        path = _local(uri) or uri
        if is_remote(path):
            return {"url": path, "name": path.rsplit("/", 1)[-1]}
        if self._storages is None:
            fields = ["code", "linux_path", "mac_path", "windows_path"]
            self._storages = self.sg.find("LocalStorage", [], fields)
        for storage in self._storages:
            roots = [storage.get(k) for k in ("linux_path", "mac_path", "windows_path")]
            if any(root and path.startswith(root.rstrip("/") + "/") for root in roots):
                return {"local_path": path, "name": path.rsplit("/", 1)[-1]}
        return {"url": f"file://{path}", "name": path.rsplit("/", 1)[-1]}

    def _find_or_create(
        self, entity_type: str, filters: list[Any], fields: dict[str, Any], item: PublishItem
    ) -> dict[str, Any]:
        found = self.sg.find_one(entity_type, filters)
        if found is not None:
            return _link(found)
        self.may_create(item, f"{entity_type} {fields.get('code') or fields.get('content')!r}")
        return _link(self.sg.create(entity_type, fields))


def _link(entity: dict[str, Any]) -> dict[str, Any]:
    return {"type": entity["type"], "id": entity["id"]}


def _local(uri: str | None) -> str | None:
    if uri is None:
        return None
    return uri[len("file://") :] if uri.startswith("file://") else uri


def _translated(exc: Exception, where: str, key: str | None) -> Exception:
    """A client's exception as ours: the login refused, the site away, a name refused."""
    return translated(exc, "ShotGrid", where, key, ERRORS)


def connect(settings: Settings) -> ShotGridTracker:
    """The real client, logged in (a script and its key)."""
    key = login_settings(
        "ShotGrid",
        {
            "SVFX_SHOTGRID_URL": settings.shotgrid_url,
            "SVFX_SHOTGRID_SCRIPT": settings.shotgrid_script,
        },
        "SVFX_SHOTGRID_SCRIPT_KEY",
        lambda: secret(settings.shotgrid_script_key, settings.shotgrid_script_key_file),
        settings.shotgrid_script_key_file,
    )
    try:
        import shotgun_api3
    except ImportError:
        raise PublishRefused(
            "publishing to ShotGrid needs its client: pip install shotgun_api3"
        ) from None
    url = str(settings.shotgrid_url)
    try:
        sg = shotgun_api3.Shotgun(
            url, script_name=settings.shotgrid_script, api_key=key, connect=False
        )
        sg.config.timeout_secs = settings.publish_timeout_s
        sg.connect()
        sg.find_one("Project", [])  # proves the login
    except Exception as exc:
        raise _translated(exc, url, key) from None
    return ShotGridTracker(sg, url, key)

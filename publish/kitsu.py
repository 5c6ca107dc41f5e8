"""Kitsu (CGWire's zou) through ``gazu``, as Kitsu does it: on the shot, under the task of
the publish task type, one comment (the item's text, task status "Waiting For Approval")
carrying a preview revision, the review clip, with the contact sheet as an extra preview of
the same revision set as the shot's thumbnail (the clip is stored as it is,
``normalize_movie=False``: it is H.264, yuv420p, faststart already, with the frame numbers
burnt in; zou 1.0.97's normalisation drops every video frame of a clip whose only keyframe
comes first with B-frames, when it trims the clip after adding a silent soundtrack); and an
output file per file of the item (EXR sequence, Zarr store, Nuke script; named after the
version, at the revision of the preview, its ``path`` the real one, a sequence as ``%04d``).

What was made is found again (the comment by the version's name in its text, its previews,
the output files named after the version), so a second publish of the same version makes
nothing new and one cut short is completed, not repeated; a new version is a new comment and
revision. A missing sequence, shot, task type or task is created with
``SVFX_PUBLISH_CREATE=true``, else refused by name; a missing project is always refused.
``gazu`` is imported only here; each tracker has a client of its own (gazu's default one is
never used)."""

from __future__ import annotations

from typing import Any

from schemas.settings import Settings, secret

from .errors import PublishRefused
from .item import PublishedFile, PublishItem
from .local_files import local_path
from .tracker import ClientErrors, Published, TrackerAdapter, login_settings, translated

OUTPUT_TYPES = {"exr": ("EXR", "exr"), "zarr": ("Zarr", "zarr"), "nuke": ("Nuke Script", "nk")}
REVIEW_STATUS = "wfa"  # Kitsu's "Waiting For Approval"
FILE_STATUS = "Created"  # an output file needs one; a fresh Kitsu has none
ERRORS = ClientErrors(  # gazu's and requests' exceptions
    login=frozenset({"AuthFailedException", "NotAuthenticatedException"}),
    login_settings="SVFX_KITSU_EMAIL and SVFX_KITSU_PASSWORD",
    unavailable=frozenset({
        "ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout", "ServerErrorException",
        "HostException",
    }),
    unavailable_types=(OSError,),
    refused=frozenset({
        "ParameterException", "NotAllowedException", "ValidationException",
        "RouteNotFoundException", "UploadFailedException",
    }),
)  # fmt: skip


class KitsuTracker(TrackerAdapter):
    name = "kitsu"
    label = "Kitsu"
    errors = ERRORS

    def __init__(self, client: Any, where: str, password: str | None = None) -> None:
        super().__init__(where, password)
        self.client = client

    def _publish(self, item: PublishItem) -> Published:
        import gazu

        c = self.client
        project, sequence, shot, task_type, task = self._entities(gazu, item)
        ids: dict[str, Any] = {
            "project": project["id"],
            "sequence": sequence["id"],
            "shot": shot["id"],
            "task_type": task_type["id"],
            "task": task["id"],
        }
        found = gazu.files.all_output_files_for_entity(
            shot, task_type=task_type, name=item.code, client=c
        )
        made = {f["representation"]: f for f in found}
        created = self._review(gazu, item, task, ids)
        data = {k: ids.get(k) for k in ("comment", "preview_file", "revision")}
        for f in item.files:
            if f.kind not in made:
                made[f.kind] = self._output_file(gazu, item, f, shot, task_type, data)
                created = True
        ids["output_files"] = sorted(f["id"] for f in made.values())
        return Published(ids, created=created)

    def _entities(self, gazu: Any, item: PublishItem) -> tuple[Any, Any, Any, Any, Any]:
        """The item's project, sequence, shot, task type and task, each found or made."""
        c = self.client
        project = gazu.project.get_project_by_name(item.show, client=c)
        if project is None:
            raise self.no_project(item)
        sequence = gazu.shot.get_sequence_by_name(project, item.sequence, client=c)
        if sequence is None:
            self.may_create(item, f"sequence {item.sequence!r}")
            sequence = gazu.shot.new_sequence(project, item.sequence, client=c)
        shot = gazu.shot.get_shot_by_name(sequence, item.shot, client=c)
        if shot is None:
            self.may_create(item, f"shot {item.shot!r}")
            shot = gazu.shot.new_shot(
                project, sequence, item.shot,
                frame_in=item.first_frame, frame_out=item.last_frame, client=c,
            )  # fmt: skip
        task_type = gazu.task.get_task_type_by_name(item.task, "Shot", client=c)
        if task_type is None:
            self.may_create(item, f"task type {item.task!r}")
            task_type = gazu.task.new_task_type(item.task, for_entity="Shot", client=c)
            gazu.project.add_task_type(project, task_type, priority=1, client=c)
        task = gazu.task.get_task_by_entity(shot, task_type, client=c)
        if task is None:
            self.may_create(item, f"{item.task!r} task")
            task = gazu.task.new_task(shot, task_type, client=c)
        return project, sequence, shot, task_type, task

    def _review(self, gazu: Any, item: PublishItem, task: Any, ids: dict[str, Any]) -> bool:
        """The version's comment with its clip and contact sheet, found or made; their ids
        go into ``ids``. True when anything was made."""
        c = self.client
        comment = self._our_comment(gazu, task, item)
        created = comment is None
        if comment is None:
            status = gazu.task.get_task_status_by_short_name(REVIEW_STATUS, client=c)
            status = status or gazu.task.get_default_task_status(client=c)
            comment = gazu.task.add_comment(task, status, item.comment, client=c)
        ids["comment"] = comment["id"]
        previews = sorted(comment.get("previews") or [], key=lambda p: p.get("position") or 0)
        movie = next((p for p in previews if p.get("extension") == "mp4"), None)
        if movie is None and item.movie is not None:
            with local_path(item.movie) as path:
                movie = gazu.task.add_preview(
                    task, comment, preview_file_path=path, normalize_movie=False, client=c
                )
            created = True
        if movie is not None:
            ids["preview_file"], ids["revision"] = movie["id"], movie["revision"]
            sheet = next((p for p in previews if p.get("extension") in ("png", "jpg")), None)
            if sheet is None and item.thumbnail is not None:
                with local_path(item.thumbnail) as path:
                    sheet = gazu.task.add_extra_preview(
                        task, comment, movie, preview_file_path=path, no_job=True, client=c
                    )
                gazu.task.set_main_preview(sheet, client=c)
                created = True
            if sheet is not None:
                ids["thumbnail"] = sheet["id"]
        return created

    def _our_comment(self, gazu: Any, task: Any, item: PublishItem) -> Any:
        """The comment an earlier publish of this version posted on the task (its text names
        the version), with its previews; None when there is none."""
        mark = f"sapiens-vfx {item.code} ("
        for comment in gazu.task.all_comments_for_task(task, client=self.client):
            if mark in (comment.get("text") or ""):
                return comment
        return None

    def _output_file(
        self, gazu: Any, item: PublishItem, f: PublishedFile, shot: Any, task_type: Any,
        data: dict[str, Any],
    ) -> Any:  # fmt: skip
        """An output file with our path, made directly (zou's ``output-files/new`` builds a
        path from the project's file tree, which a studio may not have set)."""
        c = self.client
        name, short = OUTPUT_TYPES[f.kind]
        output_type = gazu.files.new_output_type(name, short, client=c)
        frames = item.last_frame - item.first_frame + 1 if f.kind == "exr" else 1
        status = gazu.files.get_file_status_by_name(FILE_STATUS, client=c)
        status = status or gazu.files.new_file_status(FILE_STATUS, "#f5f5f5", client=c)
        return gazu.client.create(
            "output-files",
            {
                "name": item.code,
                "entity_id": shot["id"],
                "output_type_id": output_type["id"],
                "task_type_id": task_type["id"],
                "file_status_id": status["id"],
                "revision": int(data.get("revision") or 1),
                "representation": f.kind,
                "nb_elements": frames,
                "path": f.path,
                "comment": item.comment.splitlines()[0],
                "data": {**data, "first_frame": item.first_frame, "last_frame": item.last_frame},
            },
            client=c,
        )


def _translated(exc: Exception, where: str, password: str | None) -> Exception:
    """gazu's and requests' exceptions as ours, the password never in them."""
    return translated(exc, "Kitsu", where, password, ERRORS)


def _bounded(session: Any, timeout_s: float) -> None:
    """Every request of the session waits at most ``timeout_s`` to connect and between bytes
    (gazu sets no timeout: a Kitsu that stops answering would hold the job that publishes)."""
    request = session.request

    def with_timeout(method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", timeout_s)
        return request(method, url, **kwargs)

    session.request = with_timeout


def connect(settings: Settings) -> KitsuTracker:
    """A gazu client of its own, logged in."""
    password = login_settings(
        "Kitsu",
        {"SVFX_KITSU_HOST": settings.kitsu_host, "SVFX_KITSU_EMAIL": settings.kitsu_email},
        "SVFX_KITSU_PASSWORD",
        lambda: secret(settings.kitsu_password, settings.kitsu_password_file),
        settings.kitsu_password_file,
    )
    try:
        import gazu
    except ImportError:
        raise PublishRefused("publishing to Kitsu needs its client: pip install gazu") from None
    host = str(settings.kitsu_host).rstrip("/")
    client = gazu.client.create_client(host)
    _bounded(client.session, settings.publish_timeout_s)
    try:
        gazu.log_in(settings.kitsu_email, password, client=client)
    except Exception as exc:
        raise _translated(exc, host, password) from None
    return KitsuTracker(client, host, password)

"""The file routes serve only what the catalog means, on SQLite and PostgreSQL: a symlink in
the output tree (to a file outside the roots, to /etc/passwd, or as a folder on the way) is
not followed out of the roots, a file named .jpg that is not a JPEG is not served, a preview
whose bytes changed since it was catalogued is not served, a FIFO does not hang the server;
real previews and contact sheets (local and s3://) still are."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import s3fs
from fastapi.testclient import TestClient

from api.app import create_app
from schemas.settings import Settings
from schemas.summaries import OutputRecord
from tasks.output_paths import ShotOutputPaths
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import TOKEN, A, C, Filled, detail, jpeg_bytes
from tests.catalog_fixtures import make_chunk

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def preview(filled: Filled, frame: int, pass_name: str = "normal") -> tuple[int, Path]:
    """(catalog id, file) of one of shot A's previews."""
    outputs = filled.client.get(
        f"/api/shots/{A}/outputs", params={"pass": pass_name, "kind": "preview"}
    ).json()["items"]
    (found,) = [o for o in outputs if o["frame"] == frame]
    return found["id"], Path(found["uri"])


def contact_sheet(filled: Filled, pass_name: str) -> Path:
    """Where shot A's contact sheet of ``pass_name`` lies (api_fixtures wrote it)."""
    spec = filled.specs[A]
    paths = ShotOutputPaths.for_shot(str(spec.output_root), *A.split("/"), spec.version)
    return Path(paths.contact_sheet(pass_name))


def catalogue_preview(filled: Filled, uri: str, data: bytes, frame: int) -> int:
    """Record one more preview of shot C at ``uri`` with the sha256 of ``data``; its id."""
    chunk = make_chunk(filled.specs[C], [frame])
    digest = hashlib.sha256(data).hexdigest()
    record = OutputRecord("normal", frame, "preview", uri, digest, len(data), (27, 48, 3), "u1")
    chunk.frames[0].outputs = [record]
    filled.catalog.record_chunk(filled.jobs[C], chunk)
    (found,) = filled.client.get("/api/provenance", params={"path": uri}).json()["outputs"]
    return int(found["id"])


def refused(response: Any, reason: str) -> None:
    """A 404 that says ``reason`` and carries none of the file's bytes."""
    assert response.status_code == 404, response.text
    assert b"root:" not in response.content
    assert response.headers["content-type"] == "application/json"
    assert reason in detail(response)


def test_a_real_preview_is_served_with_its_catalogued_bytes(filled: Filled) -> None:
    output_id, path = preview(filled, 1003)
    response = filled.client.get(f"/files/outputs/{output_id}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/jpeg"
    assert response.content == path.read_bytes()


def test_a_symlink_to_a_file_outside_the_roots_is_not_served(filled: Filled) -> None:
    output_id, path = preview(filled, 1003)
    outside = filled.root.parent / "elsewhere" / "copy.jpg"
    outside.parent.mkdir()
    outside.write_bytes(path.read_bytes())  # the very bytes catalogued: only the place is wrong
    path.unlink()
    path.symlink_to(outside)
    refused(filled.client.get(f"/files/outputs/{output_id}"), "outside the allowed roots")


def test_a_symlink_to_etc_passwd_is_not_served(filled: Filled) -> None:
    output_id, path = preview(filled, 1004)
    path.unlink()
    path.symlink_to("/etc/passwd")
    refused(filled.client.get(f"/files/outputs/{output_id}"), "outside the allowed roots")
    sheet = contact_sheet(filled, "normal")
    sheet.unlink()
    sheet.symlink_to("/etc/passwd")
    refused(filled.client.get(f"/files/contact/{A}/normal"), "outside the allowed roots")


def test_a_symlinked_folder_on_the_way_is_not_followed_out_of_the_roots(filled: Filled) -> None:
    output_id, path = preview(filled, 1005)
    folder = path.parent
    moved = filled.root.parent / "moved_previews"
    shutil.move(folder, moved)  # same files, same bytes: only the place is wrong
    folder.symlink_to(moved, target_is_directory=True)
    refused(filled.client.get(f"/files/outputs/{output_id}"), "outside the allowed roots")


def test_a_symlink_that_stays_inside_the_roots_is_served(filled: Filled) -> None:
    output_id, path = preview(filled, 1006)
    kept = filled.root / "kept" / path.name
    kept.parent.mkdir()
    path.rename(kept)
    path.symlink_to(kept)
    response = filled.client.get(f"/files/outputs/{output_id}")
    assert (response.status_code, response.content) == (200, kept.read_bytes())


def test_a_preview_whose_bytes_changed_since_cataloguing_is_not_served(filled: Filled) -> None:
    output_id, path = preview(filled, 1008)
    path.write_bytes(jpeg_bytes((255, 0, 0)))  # a valid JPEG, but not the one catalogued
    refused(filled.client.get(f"/files/outputs/{output_id}"), "changed since it was catalogued")


def test_a_file_named_jpg_that_is_not_an_image_is_not_served(filled: Filled) -> None:
    text = b"root:x:0:0:root:/root:/bin/bash\n"
    uri = str(filled.root / "out" / "notes.jpg")
    Path(uri).write_bytes(text)  # catalogued with its own sha256: only the bytes' type is wrong
    output_id = catalogue_preview(filled, uri, text, frame=20)
    refused(filled.client.get(f"/files/outputs/{output_id}"), "not image/jpeg")

    contact_sheet(filled, "normal").write_bytes(b"<html>not an image</html>")
    refused(filled.client.get(f"/files/contact/{A}/normal"), "not image/jpeg")


def test_png_suffix_needs_png_bytes(filled: Filled) -> None:
    jpeg = jpeg_bytes((10, 20, 30))
    wrong = str(filled.root / "out" / "wrong.png")
    Path(wrong).write_bytes(jpeg)
    wrong_id = catalogue_preview(filled, wrong, jpeg, 21)
    refused(filled.client.get(f"/files/outputs/{wrong_id}"), "not image/png")
    png = PNG_SIGNATURE + b"\x00\x00\x00\rIHDR"
    right = str(filled.root / "out" / "right.png")
    Path(right).write_bytes(png)
    served = filled.client.get(f"/files/outputs/{catalogue_preview(filled, right, png, 22)}")
    assert (served.status_code, served.headers["content-type"]) == (200, "image/png")


@pytest.mark.timeout(60)  # before the fix, reading a FIFO blocked the server for good
def test_a_fifo_named_jpg_does_not_block_the_server(filled: Filled) -> None:
    output_id, path = preview(filled, 1001, "seg")
    path.unlink()
    os.mkfifo(path)
    refused(filled.client.get(f"/files/outputs/{output_id}"), "not a regular file")


def test_previews_in_a_bucket_are_served_after_the_same_checks(
    filled: Filled, s3_bucket: tuple[str, dict[str, Any]], s3_endpoint: str
) -> None:
    bucket, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    jpeg, text = jpeg_bytes((1, 2, 3)), b"not an image"
    fs.pipe({f"{bucket}/p/good.jpg": jpeg, f"{bucket}/p/bad.jpg": text})
    good = catalogue_preview(filled, f"{bucket}/p/good.jpg", jpeg, 30)
    bad = catalogue_preview(filled, f"{bucket}/p/bad.jpg", text, 31)
    changed = catalogue_preview(filled, f"{bucket}/p/changed.jpg", jpeg, 32)
    fs.pipe({f"{bucket}/p/changed.jpg": jpeg_bytes((9, 9, 9))})
    elsewhere = catalogue_preview(filled, "s3://another-bucket/p/good.jpg", jpeg, 33)
    roots = [str(filled.root), bucket]
    settings = Settings(home=filled.root / "home", allowed_roots=roots, s3_endpoint_url=s3_endpoint)
    client = TestClient(create_app(settings, engine=filled.catalog.engine, token=TOKEN))

    served = client.get(f"/files/outputs/{good}")
    assert (served.status_code, served.content) == (200, jpeg)
    refused(client.get(f"/files/outputs/{bad}"), "not image/jpeg")
    refused(client.get(f"/files/outputs/{changed}"), "changed since it was catalogued")
    refused(client.get(f"/files/outputs/{elsewhere}"), "outside the allowed roots")

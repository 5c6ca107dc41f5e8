"""A version folder's bytes on its storage (local disk or ``s3://``) against the catalog's:
which catalogued files are missing or of another size, what the Zarr store really holds, and
the files on disk the catalog does not know, split into those it is not meant to know (frame
records, the Nuke script, the shot's pose JSON, review clips, contact sheets, the Zarr
group's metadata) and the unknown ones.

The catalog records a Zarr array's frames as their uncompressed bytes; the store holds them
compressed, so its bytes are shown beside the catalog's and never count as a difference."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from storage.location import Location

# Files a version holds that the catalog records no row for: (where, how the name ends/starts)
_EXPECTED = (
    (".frame_records/", None),
    ("review/", None),
    (None, ".nk"),
    (None, "_pose.json"),
    (None, "_contact.jpg"),
)


@dataclass
class FolderCheck:
    """One version folder: what the catalog says, what the disk holds, and the differences
    (paths relative to the folder)."""

    output_root: str
    catalog_files: int = 0
    catalog_bytes: int = 0  # Zarr arrays: their frames uncompressed
    disk_bytes: int = 0  # the catalogued files (Zarr arrays: as stored) found on disk
    missing: list[str] = field(default_factory=list)
    resized: list[dict[str, Any]] = field(default_factory=list)  # path, catalog, disk
    outside: list[str] = field(default_factory=list)  # catalogued, not under the folder
    expected_files: int = 0  # on disk, of the kinds the catalog does not record
    expected_bytes: int = 0
    unknown: list[str] = field(default_factory=list)
    unknown_bytes: int = 0
    folder_found: bool = True

    @property
    def differs(self) -> bool:
        return bool(self.missing or self.resized or self.unknown or not self.folder_found)

    def as_dict(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {**values, "differs": self.differs}


def expected_extra(relative: str) -> bool:
    """Whether a file of a version folder is one the catalog records no row for."""
    if ".zarr/" in relative:  # the group's metadata, arrays recorded under other names
        return True
    for folder, ending in _EXPECTED:
        if folder is not None and (relative.startswith(folder) or f"/{folder}" in relative):
            return True
        if ending is not None and relative.endswith(ending):
            return True
    return False


def disk_sizes(folder: Location) -> dict[str, int] | None:
    """Every file under ``folder`` (relative path -> bytes); None when the folder is not
    there. OSError when the storage cannot be listed."""
    fs, path = folder.fs_and_path()
    path = path.rstrip("/")
    if not fs.exists(path):
        return None
    found = fs.find(path, detail=True)
    sizes = {}
    for name, info in found.items():
        if info.get("type", "file") == "file":
            sizes[str(name)[len(path) + 1 :]] = int(info.get("size") or 0)
    return sizes


def check_folder(folder: Location, files: Iterable[dict[str, Any]]) -> FolderCheck:
    """Compare the catalog's ``files`` of a version folder (`queries.version_files`: uri,
    kind, size_bytes) with what ``folder`` holds."""
    root = folder.uri.rstrip("/")
    check = FolderCheck(root)
    on_disk = disk_sizes(folder)
    check.folder_found = on_disk is not None
    sizes = dict(on_disk or {})
    for item in files:
        check.catalog_files += 1
        check.catalog_bytes += int(item["size_bytes"])
        uri = str(item["uri"])
        if not uri.startswith(root + "/"):
            check.outside.append(uri)
            continue
        relative = uri[len(root) + 1 :]
        if item["kind"] == "zarr":
            _match_array(check, relative, sizes)
        elif relative not in sizes:
            check.missing.append(relative)
        else:
            disk = sizes.pop(relative)
            check.disk_bytes += disk
            if disk != int(item["size_bytes"]):
                check.resized.append(
                    {"path": relative, "catalog": int(item["size_bytes"]), "disk": disk}
                )
    for relative, size in sorted(sizes.items()):
        if expected_extra(relative):
            check.expected_files += 1
            check.expected_bytes += size
        else:
            check.unknown.append(relative)
            check.unknown_bytes += size
    return check


def _match_array(check: FolderCheck, relative: str, sizes: dict[str, int]) -> None:
    """A catalogued Zarr array: its stored bytes (every file under it) taken from ``sizes``
    into the disk's count; missing when nothing is stored under it."""
    inside = [name for name in sizes if name.startswith(relative + "/")]
    if not inside:
        check.missing.append(relative)
        return
    check.disk_bytes += sum(sizes.pop(name) for name in inside)

"""`svfx catalog usage`'s parts: the scope it is asked about, its tables in human sizes, and
``--verify``, each version folder's bytes on its storage against the catalog's."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from schemas.catalog import queries
from schemas.catalog.queries.usage import Level, human_bytes
from schemas.settings import Settings
from tasks.usage_check import FolderCheck, check_folder

from .console import console, err, fail, table

BY = ("show", "shot", "version", "pass")


def scope(path: str | None) -> dict[str, str | None]:
    """SHOW[/SEQ[/SHOT]] as the filters of the usage query; a path that cannot name a shot
    (too many parts, an empty part, ``.`` or ``..``) is refused."""
    names: list[str | None] = [None, None, None]
    if path:
        parts = path.strip("/").split("/")
        if len(parts) > 3:
            raise fail(f"usage: {path!r} has {len(parts)} parts; give SHOW[/SEQ[/SHOT]]")
        if any(part in ("", ".", "..") for part in parts):
            raise fail(f"usage: {path!r} is not a shot path (an empty, '.' or '..' part)")
        names[: len(parts)] = parts
    return {"show": names[0], "sequence": names[1], "shot": names[2]}


def level_of(by: str | None, where: dict[str, str | None]) -> tuple[Level, bool]:
    """The query's level and whether per pass, from ``--by`` or the scope's depth."""
    if by is None:
        by = "version" if where["shot"] else "shot" if where["show"] else "show"
    if by not in BY:
        raise fail(f"--by must be one of {', '.join(BY)}, got {by!r}")
    return ("version", True) if by == "pass" else (by, False)  # type: ignore[return-value]


def show_usage(rows: list[dict[str, Any]], level: str, passes: bool) -> None:
    """Usage rows as a table with human sizes, and the total under it."""
    columns = {"show": ["show"], "shot": ["shot"], "version": ["shot", "folder", "version"]}[level]
    if passes:
        columns += ["pass", "kind"]
    view = []
    for row in rows:
        cells = {**row, "size": human_bytes(row["size_bytes"])}
        cells["shot"] = "/".join(str(row.get(k)) for k in ("show", "sequence", "shot"))
        cells["pass"] = row.get("pass_name") or "(several: multi-part EXR)"
        view.append(cells)
    table(view, [*columns, "files", "size"])
    total = sum(row["size_bytes"] for row in rows)
    files = sum(row["files"] for row in rows)
    console.print(f"total: {files} files, {human_bytes(total)} ({total} bytes)", highlight=False)


def verify(engine: Engine, settings: Settings, rows: list[dict[str, Any]]) -> list[FolderCheck]:
    """Each version folder of ``rows`` checked on its storage (a folder once, however many
    rows name it); a folderless (older) job's outputs are not checked."""
    checks = []
    seen: set[str] = set()
    for row in rows:
        root = row.get("output_root")
        if root is None or root in seen:
            continue
        seen.add(root)
        files = queries.version_files(engine, root)
        try:
            checks.append(check_folder(settings.location(root), files))
        except (OSError, ValueError) as exc:
            raise fail(f"{root}: cannot list the folder: {exc}") from None
    return checks


def show_checks(checks: list[FolderCheck]) -> None:
    """The checks as a table, catalog beside disk, then a line per folder that differs."""
    view = [
        {
            "folder": c.output_root,
            "catalog": human_bytes(c.catalog_bytes),
            "on disk": human_bytes(c.disk_bytes) if c.folder_found else "no folder",
            "other files": f"{c.expected_files} ({human_bytes(c.expected_bytes)})",
            "unknown": f"{len(c.unknown)} ({human_bytes(c.unknown_bytes)})",
            "missing": len(c.missing),
            "resized": len(c.resized),
            "status": "DIFFERS" if c.differs else "ok",
        }
        for c in checks
    ]
    columns = ["folder", "catalog", "on disk", "other files", "unknown", "missing", "resized"]
    table(view, [*columns, "status"])
    console.print(
        "catalog: the bytes the catalog records (Zarr arrays uncompressed); on disk: those "
        "files as stored; other files: frame records, Nuke script, pose JSON, review clips, "
        "contact sheets, Zarr metadata (not catalogued by design)",
        highlight=False,
        soft_wrap=True,
    )
    for c in (c for c in checks if c.differs):
        err.print(
            f"{c.output_root}: {differences(c)}", markup=False, highlight=False, soft_wrap=True
        )


def differences(check: FolderCheck) -> str:
    """What differs in one folder, in a sentence."""
    if not check.folder_found:
        return f"the folder is not there; the catalog records {check.catalog_files} files in it"
    said = []
    if check.missing:
        said.append(f"{len(check.missing)} catalogued missing ({_some(check.missing)})")
    if check.resized:
        sizes = [f"{r['path']} {r['catalog']} -> {r['disk']} bytes" for r in check.resized]
        said.append(f"{len(check.resized)} of another size ({_some(sizes)})")
    if check.unknown:
        said.append(f"{len(check.unknown)} unknown to the catalog ({_some(check.unknown)})")
    return "; ".join(said)


def _some(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")

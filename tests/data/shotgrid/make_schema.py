"""Writes the mockgun schema of the ShotGrid entities a publish touches (Project, Sequence,
Shot, Task, Version, PublishedFile, PublishedFileType, LocalStorage; EventLogEntry, which
mockgun writes when it starts), as ``mockgun.generate_schema`` would from a real site, with
Toolkit's field names. Run it again after changing the fields:
``python tests/data/shotgrid/make_schema.py``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEMA, ENTITIES = HERE / "schema.pickle", HERE / "schema_entity.pickle"

# entity type -> field -> data type (entity fields: (type, valid types))
FIELDS: dict[str, dict[str, str | tuple[str, list[str]]]] = {
    "EventLogEntry": {"event_type": "text", "description": "text"},
    "Project": {"name": "text", "sg_status": "list"},
    "Sequence": {"code": "text", "project": ("entity", ["Project"])},
    "Shot": {
        "code": "text",
        "project": ("entity", ["Project"]),
        "sg_sequence": ("entity", ["Sequence"]),
        "sg_cut_in": "number",
        "sg_cut_out": "number",
    },
    "Task": {
        "content": "text",
        "project": ("entity", ["Project"]),
        "entity": ("entity", ["Shot", "Sequence"]),
        "sg_status_list": "status_list",
    },
    "Version": {
        "code": "text",
        "project": ("entity", ["Project"]),
        "entity": ("entity", ["Shot", "Sequence"]),
        "sg_task": ("entity", ["Task"]),
        "description": "text",
        "sg_status_list": "status_list",
        "sg_path_to_frames": "text",
        "sg_first_frame": "number",
        "sg_last_frame": "number",
        "frame_count": "number",
        "frame_range": "text",
        "sg_path_to_movie": "text",
        "sg_uploaded_movie": "url",
        "image": "text",
        "published_files": ("multi_entity", ["PublishedFile"]),
    },
    "PublishedFileType": {"code": "text"},
    "LocalStorage": {
        "code": "text",
        "linux_path": "text",
        "mac_path": "text",
        "windows_path": "text",
    },
    "PublishedFile": {
        "code": "text",
        "name": "text",
        "project": ("entity", ["Project"]),
        "version_number": "number",
        "path": "url",
        "published_file_type": ("entity", ["PublishedFileType"]),
        "entity": ("entity", ["Shot", "Sequence"]),
        "task": ("entity", ["Task"]),
        "version": ("entity", ["Version"]),
        "description": "text",
    },
}


def field(name: str, kind: str | tuple[str, list[str]]) -> dict:
    data_type, valid = (kind, []) if isinstance(kind, str) else kind
    properties = {"default_value": {"value": None, "editable": True}}
    if valid:
        properties["valid_types"] = {"value": valid, "editable": True}
    return {
        "data_type": {"value": data_type, "editable": False},
        "name": {"value": name, "editable": True},
        "editable": {"value": True, "editable": False},
        "mandatory": {"value": False, "editable": False},
        "properties": properties,
    }


def main() -> None:
    schema = {
        entity: {"id": field("id", "number"), **{n: field(n, k) for n, k in fields.items()}}
        for entity, fields in FIELDS.items()
    }
    entities = {e: {"name": {"value": e}, "visible": {"value": True}} for e in FIELDS}
    SCHEMA.write_bytes(pickle.dumps(schema, protocol=2))
    ENTITIES.write_bytes(pickle.dumps(entities, protocol=2))


if __name__ == "__main__":
    main()

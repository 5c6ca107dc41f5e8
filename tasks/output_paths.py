"""Where a shot's outputs live: ``<root>/<show>/<seq>/<shot>/<family>_<version>/...``, or
``<root>/<show>/<seq>/<shot>/<element>/<family>_<version>/...`` for a plate element of a shot
with several (``bg01``, ``fg01``), so two elements never overwrite each other. ``<family>``
(``sapiens2``, ``sapiens1``) is the one the job's passes ran on, its ``--family`` for a mix
(``ShotSpec.output_family``).

    <name>.<frame>.exr                 EXR per frame (every pass asked for; multi-part unless
                                       the spec's exr_layout is single)
    <name>.zarr                        Zarr v3 group for the whole shot
    <name>_pose.json                   pose of the shot, readable without the platform
    <name>.nk                          Nuke script reading every EXR layer of the shot
    previews/<pass>/<name>_<pass>.<frame>.jpg, previews/<name>_<pass>_contact.jpg
    review/<name>_<pass>.mp4           review clip per pass, frame numbers burnt in
    .frame_records/<name>.<frame>.json what the worker made of each frame, written last

with ``<name> = <shot>_<family>_<version>`` (``<shot>_<element>_<family>_<version>``); frame
numbers padded like the plate (>= 4).

The methods give URI strings (what the catalog, the summaries and the messages name); the
shot folder's `location` carries the storage options, and `at` reaches any of them with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.location import Location, Where, as_location


@dataclass(frozen=True)
class ShotOutputPaths:
    location: Location  # the shot's output folder, with the options that reach it
    name: str
    padding: int = 4

    @property
    def root(self) -> str:
        return self.location.uri

    def at(self, uri: str) -> Location:
        """An output of the shot (a URI from the methods below), reached the way the shot's
        folder is."""
        return self.location.at(uri)

    @classmethod
    def for_shot(
        cls,
        output_root: Where,
        show: str,
        sequence: str,
        shot: str,
        version: str,
        padding: int = 4,
        element: str | None = None,
        family: str = "sapiens2",
    ) -> ShotOutputPaths:
        outputs = as_location(output_root)
        shot_dir = f"{outputs.uri.rstrip('/')}/{show}/{sequence}/{shot}"
        if element:
            root = f"{shot_dir}/{element}/{family}_{version}"
            name = f"{shot}_{element}_{family}_{version}"
        else:
            root, name = f"{shot_dir}/{family}_{version}", f"{shot}_{family}_{version}"
        return cls(outputs.at(root), name=name, padding=max(4, padding))

    def _frame(self, frame: int) -> str:
        sign = "-" if frame < 0 else ""
        return f"{sign}{abs(frame):0{self.padding}d}"

    def exr(self, frame: int) -> str:
        return f"{self.root}/{self.name}.{self._frame(frame)}.exr"

    @property
    def exr_glob(self) -> str:
        """The file names of the shot's EXRs, as a glob inside its folder."""
        return f"{self.name}.*.exr"

    @property
    def exr_pattern(self) -> str:
        """The EXR sequence as Nuke reads it (``%04d`` style)."""
        return f"{self.root}/{self.name}.%0{self.padding}d.exr"

    @property
    def zarr(self) -> str:
        return f"{self.root}/{self.name}.zarr"

    @property
    def nuke_script(self) -> str:
        """The shot's Nuke script, beside the EXRs it reads."""
        return f"{self.root}/{self.name}.nk"

    @property
    def pose_json(self) -> str:
        return f"{self.root}/{self.name}_pose.json"

    @property
    def pose_fragments(self) -> str:
        return f"{self.root}/.pose_frames"

    @property
    def frame_records(self) -> str:
        return f"{self.root}/.frame_records"

    def frame_record(self, frame: int) -> str:
        return f"{self.frame_records}/{self.name}.{self._frame(frame)}.json"

    def preview(self, pass_name: str, frame: int) -> str:
        return f"{self.root}/previews/{pass_name}/{self.name}_{pass_name}.{self._frame(frame)}.jpg"

    def contact_sheet(self, pass_name: str) -> str:
        return f"{self.root}/previews/{self.name}_{pass_name}_contact.jpg"

    def review_clip(self, pass_name: str) -> str:
        return f"{self.root}/review/{self.name}_{pass_name}.mp4"

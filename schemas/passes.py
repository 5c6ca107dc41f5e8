"""The pass table: every pass the platform makes, declared once.

A pass is a frozen ``Pass`` value: what it is, which model families make it (and with which
checkpoint task), how it is inferred, how the model's device finishes it, what it writes
(EXR layers, a Zarr array, a preview, a side file), whether its values are colour, how
temporal QC measures its change, how a stabilised version fuses it over time and how the
Nuke script presents it. Everything else derives from ``PASSES``: the CLI's and the API's
pass lists, defaults and help, the spec's validation, tiling, the device stage, the EXR and
Zarr layouts, previews, QC, stabilisation, the Nuke script and the outputs a finished frame
has. ``docs/architecture.md`` says how to add one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from schemas.part_groups import PART_GROUPS
from storage.layers import ExrLayer, PreviewKind, ZarrArray

# How a pass is inferred: on overlapping tiles of the frame; on the whole frame, letterboxed
# to the model's input; per person box (top-down); from another pass's model output; or by
# no model at all: optical flow between the plate's neighbouring frames (tasks.plate_flow).
Inference = Literal["tiled", "whole_frame", "per_person", "from_seg", "plate_flow"]
# How the model's device finishes a pass into the arrays its files hold (tasks.frame_passes).
Values = Literal[
    "unit_vectors", "points", "relative_depth", "colour", "alpha", "labels", "keypoints",
    "class_groups", "motion",
]  # fmt: skip
# How a stabilised version fuses a pass (tasks.stabilise.rules); None: not fused.
Fusion = Literal["unit_vectors", "points", "relative_depth", "colour", "alpha", "labels"]
FUSIONS: tuple[Fusion, ...] = get_args(Fusion)
# How temporal QC measures the change of a pass between neighbouring frames.
QcMetric = Literal["angle", "relative_distance", "absolute", "mean_absolute", "labels"]
OutputKind = Literal["exr", "zarr", "preview", "pose_json"]
OUTPUT_KINDS: tuple[OutputKind, ...] = get_args(OutputKind)
FAMILIES: tuple[str, ...] = ("sapiens2", "sapiens1")
DEFAULT_FAMILY = "sapiens2"  # a job that does not say (--family)
_HW = ("frame", "y", "x")
_HWC = ("frame", "y", "x", "c")
# Nuke's `motion` layer, in its channel order (VectorBlur reads forward.u/v from it).
MOTION_CHANNELS = ("forward.u", "forward.v", "backward.u", "backward.v")


@dataclass(frozen=True)
class Pass:
    """One pass. ``models``: family -> the task of the checkpoint that makes it (empty: made
    from another pass's model, ``inference`` says which). ``needs``: other passes that must
    run with it, any one of them (the first is run, not written, when none was asked for).
    ``person_mask``: its output tells where the person is (for pose boxes and relative
    depth); the first such pass asked for is used."""

    name: str
    description: str
    models: Mapping[str, str]
    inference: Inference
    values: Values
    exr: tuple[ExrLayer, ...] = ()
    zarr: ZarrArray | None = None
    preview: PreviewKind | Literal["keypoints"] | None = None
    qc: QcMetric | None = None
    fusion: Fusion | None = None
    nuke_note: str = ""
    nuke_colour: str = "0x5c5c5cff"  # the backdrop of its Nuke nodes (0xRRGGBBAA)
    default: bool = True  # a shot that names no passes gets it
    needs: tuple[str, ...] = ()
    person_mask: bool = False
    side_file: OutputKind | None = None
    class_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # A tiled pass's model output where the person gate ran no tile (None: never gated).
    background: Literal["zeros", "background_class"] | None = None

    @property
    def scene_linear(self) -> bool:
        """Its values are colour: converted back to the plate's scene-linear space on the
        host (OpenColorIO) and tagged so in the EXR and the Nuke script."""
        return any(layer.scene_linear for layer in self.exr)


PASSES: tuple[Pass, ...] = (
    Pass(
        "normal",
        "camera-space unit normals",
        {"sapiens2": "normal", "sapiens1": "normal"},
        "tiled",
        "unit_vectors",
        exr=(ExrLayer("N", ("N.x", "N.y", "N.z"), "float16", "camera-space unit normals"),),
        zarr=ZarrArray(
            "normal",
            ("H", "W", 3),
            "float16",
            _HWC,
            float("nan"),
            "camera-space unit normals (OpenCV axes: +x right, +y down, +z forward)",
        ),
        preview="vectors",
        qc="angle",
        fusion="unit_vectors",
        nuke_note="camera-space unit normals",
        background="zeros",
        nuke_colour="0x4c5a78ff",
    ),
    Pass(
        "pointmap",
        "camera-space position in metres (and metric depth)",
        {"sapiens2": "pointmap"},
        "whole_frame",
        "points",
        exr=(
            ExrLayer(
                "P",
                ("P.x", "P.y", "P.z", "depth.Z"),  # one plane serves both P.z and depth.Z
                "float32",
                "camera-space position in metres; depth.Z = P.z (distance along the forward axis)",
                planes=(0, 1, 2, 2),
            ),
        ),
        zarr=ZarrArray(
            "pointmap",
            ("H", "W", 3),
            "float32",
            _HWC,
            float("nan"),
            "camera-space position in metres; [..., 2] is metric depth",
        ),
        preview="inverse_depth",
        qc="relative_distance",
        fusion="points",
        nuke_note="camera-space position (m); depth.Z = P.z",
        nuke_colour="0x4c7068ff",
    ),
    Pass(
        "depth",
        "relative depth over the person (Sapiens v1), not metric",
        {"sapiens1": "depth"},
        "whole_frame",
        "relative_depth",
        exr=(
            ExrLayer(
                "relDepth",
                ("relDepth.Z",),
                "float32",
                "relative depth (Sapiens v1), not metric: over the person 0 nearest to 1 "
                "farthest, -1 elsewhere (metric depth is depth.Z in P)",
            ),
        ),
        zarr=ZarrArray(
            "depth",
            ("H", "W"),
            "float32",
            _HW,
            float("nan"),
            "relative depth (Sapiens v1), not metric: over the person 0 nearest to 1 "
            "farthest, -1 elsewhere",
        ),
        preview="relative_depth",
        qc="absolute",  # relative: its own per-frame scale shows as change too
        fusion="relative_depth",
        nuke_note="relative depth (Sapiens v1): 0 near, 1 far on the person, -1 elsewhere; "
        "not metric",
        nuke_colour="0x4c6e7aff",
        default=False,
        needs=("seg", "matte"),
    ),
    Pass(
        "albedo",
        "scene-linear albedo",
        {"sapiens2": "albedo"},
        "tiled",
        "colour",
        exr=(
            ExrLayer(
                "albedo",
                ("albedo.R", "albedo.G", "albedo.B"),
                "float16",
                "scene-linear albedo",
                scene_linear=True,
            ),
        ),
        zarr=ZarrArray(
            "albedo",
            ("H", "W", 3),
            "float16",
            _HWC,
            float("nan"),
            "scene-linear albedo in the plate's working space",
        ),
        preview="colour",
        qc="mean_absolute",
        fusion="colour",
        nuke_note="scene-linear",
        background="zeros",
        nuke_colour="0x7a6a4cff",
    ),
    Pass(
        "matte",
        "person alpha",
        {"sapiens2": "matting"},
        "tiled",
        "alpha",
        exr=(ExrLayer("matte", ("matte.A",), "float16", "person alpha"),),
        zarr=ZarrArray("matte", ("H", "W"), "float16", _HW, float("nan"), "person alpha"),
        preview="alpha",
        qc="absolute",
        fusion="alpha",
        nuke_note="person alpha",
        background="zeros",
        person_mask=True,
    ),
    Pass(
        "seg",
        "body-part segmentation: Cryptomatte and class index",
        {"sapiens2": "seg", "sapiens1": "seg"},
        "tiled",
        "labels",
        exr=(
            ExrLayer(
                "CryptoBodyPart",
                (),
                "float32",
                "Cryptomatte of the body-part classes (coverage = class probability)",
                cryptomatte=True,
            ),
            ExrLayer(
                "seg",
                ("seg.id",),
                "uint32",
                "body-part class index (argmax of the class probabilities)",
                class_names=True,
            ),
        ),
        zarr=ZarrArray(
            "seg",
            ("H", "W"),
            "uint8",
            _HW,
            255,
            "body-part class index (names in the class_names attribute: index -> name)",
            class_names=True,
        ),
        preview="labels",
        qc="labels",
        fusion="labels",
        nuke_note="body parts: Cryptomatte + class index",
        nuke_colour="0x6e4c70ff",
        background="background_class",
        person_mask=True,
    ),
    Pass(
        "parts",
        "soft body-part mattes from seg: " + ", ".join(PART_GROUPS),
        {},
        "from_seg",
        "class_groups",
        exr=(
            ExrLayer(
                "parts",
                tuple(f"parts.{group}" for group in PART_GROUPS),
                "float16",
                "soft body-part mattes: the summed seg probability of each group's classes",
            ),
        ),
        zarr=ZarrArray(
            "parts",
            ("H", "W", len(PART_GROUPS)),
            "float16",
            _HWC,
            float("nan"),
            f"soft body-part mattes, c: {', '.join(PART_GROUPS)} (summed seg probabilities)",
        ),
        preview="alpha",
        qc="mean_absolute",
        fusion="alpha",
        nuke_note="soft body-part mattes (from seg): " + " ".join(PART_GROUPS),
        nuke_colour="0x704c5cff",
        default=False,
        class_groups=PART_GROUPS,
    ),
    Pass(
        "motion",
        "motion vectors from the plate: optical flow to the next and previous frames",
        {},
        "plate_flow",
        "motion",
        # Nuke's `motion` layer. Half: DIS's own error is far above half's rounding (2^-11 of
        # the value), Nuke and renderers read and write half vectors, and it halves the bytes.
        exr=(
            ExrLayer(
                "motion",
                MOTION_CHANNELS,
                "float16",
                "motion vectors in plate pixels per frame to the next (forward) and previous "
                "(backward) frame, Nuke's axes: u right, v up; zero where there is no "
                "neighbour (a hole, the range's end) or a cut",
            ),
        ),
        zarr=ZarrArray(
            "motion",
            ("H", "W", 4),
            "float16",
            _HWC,
            float("nan"),
            "motion vectors in plate pixels per frame, c: forward u, forward v, backward u, "
            "backward v (the EXR's values: u right, v UP, i.e. v = -rows; an anamorphic "
            "plate's u is in its stored, squeezed pixels); 0 where there is no neighbour or "
            "a cut",
        ),
        preview="motion",
        nuke_note="motion vectors (px/frame, v up): forward.u/v backward.u/v; VectorBlur "
        "(disabled) wired",
        nuke_colour="0x5a704cff",
        default=False,
    ),
    Pass(
        "pose",
        "body keypoints per person (JSON and Zarr)",
        {"sapiens2": "pose", "sapiens1": "pose"},
        "per_person",
        "keypoints",
        zarr=ZarrArray(
            "pose",
            ("P", "K", 3),
            "float32",
            ("frame", "person", "keypoint", "xys"),
            float("nan"),
            "per person and keypoint: x, y in plate pixels and a score; NaN: no person",
            keypoints=True,
        ),
        preview="keypoints",
        needs=("seg", "matte"),
        side_file="pose_json",
    ),
)

BY_NAME: Mapping[str, Pass] = {p.name: p for p in PASSES}
PASS_NAMES: tuple[str, ...] = tuple(BY_NAME)
DEFAULT_PASSES: tuple[str, ...] = tuple(p.name for p in PASSES if p.default)
# Where the person mask comes from, first choice first (seg knows the person's parts).
PERSON_MASK_FROM: tuple[str, ...] = tuple(
    sorted((p.name for p in PASSES if p.person_mask), key=lambda n: BY_NAME[n].values != "labels")
)


def in_order(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` in the table's order (known passes only)."""
    wanted = set(names)
    return tuple(p.name for p in PASSES if p.name in wanted)


def families_of(name: str) -> tuple[str, ...]:
    """The families that make the pass: those of its model, or of the pass it is made from;
    every family for a pass no model makes (motion: it runs beside any)."""
    if not made_by_model(name):
        return FAMILIES
    spec = BY_NAME[name]
    if spec.models:
        return tuple(f for f in FAMILIES if f in spec.models)
    return families_of(made_from(name))


def made_by_model(name: str) -> bool:
    """Whether a model makes ``name`` (its own, or the one of the pass it is made from):
    not motion, which is optical flow on the plate."""
    return bool(BY_NAME[made_from(name)].models)


def family_of(name: str, family: str) -> str:
    """The family pass ``name`` runs on in a job asking for ``family``: that one when it
    has the pass, else the first that does (depth: Sapiens v1; pointmap: Sapiens2). A pass
    no model makes runs on the job's ``family``."""
    have = families_of(name)
    return family if family in have else have[0]


def job_family(asked: Iterable[str], family: str) -> str:
    """The family a job's output folder is named after: the one every model-made pass asked
    for runs on (a depth-only job: Sapiens v1; motion does not count), else ``family`` (the
    job's ``--family``) for a mix. From the spec alone, so a job's folder is known before its
    checkpoints are read; a file given for one pass does not change it."""
    ran = {family_of(name, family) for name in asked if made_by_model(name)}
    return ran.pop() if len(ran) == 1 else family


def first_of_kind(names: Sequence[str] | Mapping[str, object], values: Values) -> str | None:
    """The first of ``names`` (in the table's order) whose values are ``values``: e.g. the
    pass among a job's that makes keypoints, or class labels."""
    return next((p.name for p in PASSES if p.name in names and p.values == values), None)


def fusion_rules(names: Sequence[str]) -> dict[str, Fusion]:
    """Pass -> its fusion rule, for the passes of ``names`` a stabilised version fuses: each
    with a rule, but one made from another's output where that one is in ``names`` (parts:
    made again from the fused class probabilities of seg)."""
    fused = {n: BY_NAME[n].fusion for n in names if made_from(n) == n or made_from(n) not in names}
    return {n: rule for n, rule in fused.items() if rule is not None}


def model_task(name: str) -> str:
    """The task of the checkpoint that makes ``name`` (the same in every family that has it).
    ValueError for a pass no model makes."""
    if not made_by_model(name):
        raise ValueError(f"{name} is made by no model: it has no checkpoint task")
    tasks = set(BY_NAME[made_from(name)].models.values())
    assert len(tasks) == 1, f"{name}: its families' tasks differ: {tasks}"
    return tasks.pop()


def made_from(name: str) -> str:
    """The pass whose model makes ``name`` (itself, unless it is derived from another)."""
    spec = BY_NAME[name]
    return "seg" if spec.inference == "from_seg" else name


def model_passes(asked: Sequence[str]) -> tuple[str, ...]:
    """The passes the models must run for ``asked``: each pass's ``needs`` (the first of them
    when none is asked for) and the pass a derived pass is made from, in table order."""
    run = set(asked)
    for name in asked:
        needs = BY_NAME[name].needs
        if needs and not set(needs) & run:
            run.add(needs[0])
    run |= {made_from(name) for name in list(run)}
    return in_order(name for name in run if BY_NAME[name].models)


def run_for(asked: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The model passes ``asked`` runs without asking for them, each -> the asked passes it
    runs for (in table order): those that need it and those made from its output. Checkpoint
    choice runs a pass needed only by passes of another family on theirs."""
    run: dict[str, tuple[str, ...]] = {}
    for name in model_passes(asked):
        if name in asked:
            continue
        users = [p for p in asked if name in BY_NAME[p].needs or made_from(p) == name]
        run[name] = in_order(users)
    return run


def derived_from(name: str) -> tuple[Pass, ...]:
    """The passes made from the model output of ``name`` (not by a model of their own)."""
    return tuple(p for p in PASSES if made_from(p.name) == name != p.name)


def checkpoint_inputs(name: str) -> tuple[str, ...]:
    """The passes whose checkpoints an output of ``name`` depends on: the model that makes it
    and those it needs (pose finds people with the seg or matte model). Conservative: a new
    seg *or* matte checkpoint invalidates pose outputs. None for a pass no model makes
    (motion depends on the plate alone)."""
    if not made_by_model(name):
        return BY_NAME[name].needs
    return (made_from(name), *BY_NAME[name].needs)


def exr_layers(names: Sequence[str]) -> tuple[ExrLayer, ...]:
    """The EXR parts of ``names``, in the table's order."""
    return tuple(layer for p in PASSES if p.name in names for layer in p.exr)


def pass_of_part(part: str) -> Pass:
    return next(p for p in PASSES for layer in p.exr if layer.part == part)


def zarr_arrays(names: Sequence[str]) -> tuple[ZarrArray, ...]:
    """The Zarr arrays of ``names``, in the table's order."""
    return tuple(p.zarr for p in PASSES if p.name in names and p.zarr is not None)


def expected_outputs(names: Sequence[str], previews: bool) -> set[tuple[str, str]]:
    """(kind, pass) of every output a finished frame of these passes has."""
    wanted: set[tuple[str, str]] = set()
    for name in names:
        spec = BY_NAME[name]
        if spec.exr:
            wanted.add(("exr", name))
        if spec.zarr is not None:
            wanted.add(("zarr", name))
        if spec.side_file is not None:
            wanted.add((spec.side_file, name))
        if previews and spec.preview is not None:
            wanted.add(("preview", name))
    return wanted


def describe() -> str:
    """Every pass with its description, for help texts: 'name: description; ...'."""
    return "; ".join(f"{p.name}: {p.description}" for p in PASSES)


def family_help() -> str:
    """Which passes the family choice applies to, for help texts."""
    modelled = [p.name for p in PASSES if made_by_model(p.name)]
    both = [name for name in modelled if len(families_of(name)) > 1]
    own = {f: [name for name in modelled if families_of(name) == (f,)] for f in FAMILIES}
    return (
        f"model family of the passes both families have ({', '.join(both)}); a pass only "
        f"one family has runs on that one ("
        + "; ".join(f"{f}: {', '.join(names)}" for f, names in own.items() if names)
        + ")"
    )

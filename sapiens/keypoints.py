"""The 308-keypoint set of the Sapiens2 pose model, in the order of its output channels.

Facts learned from upstream `facebookresearch/sapiens2` (the revision
docs/design/upstream-sources.md names), file `sapiens/pose/configs/_base_/keypoints308.py`:
the 344-point "goliath" set with its 36 `teeth_*` points removed and the rest renumbered.
The left/right mirror relation is derived here from the names by rule (`mirror_name`) and
checked in tests against the upstream `swap` relation; the skeleton is written by name and
resolved to indices.
"""

from __future__ import annotations

import re
from itertools import pairwise
from types import MappingProxyType

RGB = tuple[int, int, int]

_FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")
# Upstream orders each finger tip-first: 4, 3, 2, then the joint nearest the palm.
_FINGER_JOINTS = ("4", "3", "2", "_third_joint")


def _hand(side: str) -> list[str]:
    """One hand's 21 names in model order: 5 fingers x 4 joints, then the wrist."""
    joints = [f"{side}_{finger}{joint}" for finger in _FINGERS for joint in _FINGER_JOINTS]
    return [*joints, f"{side}_wrist"]


def _words(block: str) -> list[str]:
    return block.split()


_BODY = _words(
    """
    nose left_eye right_eye left_ear right_ear left_shoulder right_shoulder
    left_elbow right_elbow left_hip right_hip left_knee right_knee left_ankle right_ankle
    left_big_toe left_small_toe left_heel right_big_toe right_small_toe right_heel
    """
)
_ARM_AND_NECK = _words(
    """
    left_olecranon right_olecranon left_cubital_fossa right_cubital_fossa
    left_acromion right_acromion neck
    """
)
_FACE_MIDLINE_AND_BROWS = _words(
    """
    center_of_glabella center_of_nose_root tip_of_nose_bridge midpoint_1_of_nose_bridge
    midpoint_2_of_nose_bridge midpoint_3_of_nose_bridge center_of_labiomental_groove tip_of_chin
    upper_startpoint_of_r_eyebrow lower_startpoint_of_r_eyebrow end_of_r_eyebrow
    upper_midpoint_1_of_r_eyebrow lower_midpoint_1_of_r_eyebrow upper_midpoint_2_of_r_eyebrow
    upper_midpoint_3_of_r_eyebrow lower_midpoint_2_of_r_eyebrow lower_midpoint_3_of_r_eyebrow
    upper_startpoint_of_l_eyebrow lower_startpoint_of_l_eyebrow end_of_l_eyebrow
    upper_midpoint_1_of_l_eyebrow lower_midpoint_1_of_l_eyebrow upper_midpoint_2_of_l_eyebrow
    upper_midpoint_3_of_l_eyebrow lower_midpoint_2_of_l_eyebrow lower_midpoint_3_of_l_eyebrow
    """
)


def _eye_lines(side: str, lid: str, lash_midpoints: str, lid_midpoints: str) -> list[str]:
    """The lash line, eyelid line (and, for the upper lid, crease line) of one eye.

    The midpoint order differs per side because upstream numbers each contour in the
    mirrored direction on the other eye.
    """
    lash = [f"{side}_inner_end_of_{lid}_lash_line", f"{side}_outer_end_of_{lid}_lash_line"]
    lash += [f"{side}_centerpoint_of_{lid}_lash_line"]
    lash += [f"{side}_midpoint_{n}_of_{lid}_lash_line" for n in lash_midpoints.split()]
    lines = ["eyelid", "crease"] if lid == "upper" else ["eyelid"]
    rest: list[str] = [f"{side}_outer_end_of_{lid}_eyelid_line"]
    for line in lines:
        for n in lid_midpoints.split():
            point = "centerpoint" if n == "c" else f"midpoint_{n}"
            rest.append(f"{side}_{point}_of_{lid}_{line}_line")
    return lash + rest


_EYES = [
    *_eye_lines("l", "upper", "2 1 6 5 4 3", "6 2 5 c 4 1 3"),
    *_eye_lines("r", "upper", "1 2 3 4 5 6", "3 1 4 c 5 2 6"),
    *_eye_lines("l", "lower", "2 1 6 5 4 3", "6 2 5 c 4 1 3"),
    *_eye_lines("r", "lower", "1 2 3 4 5 6", "3 1 4 c 5 2 6"),
]
_NOSE_AND_MOUTH = _words(
    """
    tip_of_nose bottom_center_of_nose r_outer_corner_of_nose l_outer_corner_of_nose
    inner_corner_of_r_nostril outer_corner_of_r_nostril upper_corner_of_r_nostril
    inner_corner_of_l_nostril outer_corner_of_l_nostril upper_corner_of_l_nostril
    r_outer_corner_of_mouth l_outer_corner_of_mouth center_of_cupid_bow center_of_lower_outer_lip
    midpoint_1_of_upper_outer_lip midpoint_2_of_upper_outer_lip
    midpoint_1_of_lower_outer_lip midpoint_2_of_lower_outer_lip
    midpoint_3_of_upper_outer_lip midpoint_4_of_upper_outer_lip
    midpoint_5_of_upper_outer_lip midpoint_6_of_upper_outer_lip
    midpoint_3_of_lower_outer_lip midpoint_4_of_lower_outer_lip
    midpoint_5_of_lower_outer_lip midpoint_6_of_lower_outer_lip
    r_inner_corner_of_mouth l_inner_corner_of_mouth center_of_upper_inner_lip
    center_of_lower_inner_lip
    midpoint_1_of_upper_inner_lip midpoint_2_of_upper_inner_lip
    midpoint_1_of_lower_inner_lip midpoint_2_of_lower_inner_lip
    midpoint_3_of_upper_inner_lip midpoint_4_of_upper_inner_lip
    midpoint_5_of_upper_inner_lip midpoint_6_of_upper_inner_lip
    midpoint_3_of_lower_inner_lip midpoint_4_of_lower_inner_lip
    midpoint_5_of_lower_inner_lip midpoint_6_of_lower_inner_lip
    """
)


def _ear(side: str) -> list[str]:
    """One ear's 26 names; the right ear lists inner-helix points 2 and 8 swapped."""
    second, last = ("2", "8") if side == "l" else ("8", "2")
    parts = [
        "top_end_of_inferior_crus",
        "top_end_of_superior_crus",
        "start_of_antihelix",
        "end_of_antihelix",
        "midpoint_1_of_antihelix",
        "midpoint_1_of_inferior_crus",
        "midpoint_2_of_antihelix",
        "midpoint_3_of_antihelix",
        "point_1_of_inner_helix",
        f"point_{second}_of_inner_helix",
        *[f"point_{n}_of_inner_helix" for n in range(3, 8)],
        "highest_point_of_antitragus",
        "bottom_point_of_tragus",
        "protruding_point_of_tragus",
        "top_point_of_tragus",
        "start_point_of_crus_of_helix",
        "deepest_point_of_concha",
        "tip_of_ear_lobe",
        "midpoint_between_22_15",
        "bottom_connecting_point_of_ear_lobe",
        "top_connecting_point_of_helix",
        f"point_{last}_of_inner_helix",
    ]
    return [f"{side}_{part}" for part in parts]


def _eye_ring(side: str, part: str) -> list[str]:
    """Iris or pupil: centre, then the border at clock positions and between them."""
    border = ["3", "midpoint_1", "12", "midpoint_4", "9", "midpoint_3", "6", "midpoint_2"]
    return [f"{side}_center_of_{part}"] + [f"{side}_border_of_{part}_{b}" for b in border]


KEYPOINT_NAMES: tuple[str, ...] = (
    *_BODY,
    *_hand("right"),
    *_hand("left"),
    *_ARM_AND_NECK,
    *_FACE_MIDLINE_AND_BROWS,
    *_EYES,
    *_NOSE_AND_MOUTH,
    *_ear("l"),
    *_ear("r"),
    *_eye_ring("l", "iris"),
    *_eye_ring("r", "iris"),
    *_eye_ring("l", "pupil"),
    *_eye_ring("r", "pupil"),
)

KEYPOINT_INDEX: MappingProxyType[str, int] = MappingProxyType(
    {name: index for index, name in enumerate(KEYPOINT_NAMES)}
)

_SIDE_SWAP = {"left": "right", "right": "left", "l": "r", "r": "l"}

# Face contours are numbered in one direction around each feature, so mirroring a point
# reverses its number along the contour. (regex with a `n` group, number -> mirrored number)
_CONTOUR_RENUMBERING: tuple[tuple[re.Pattern[str], dict[str, str]], ...] = (
    (
        re.compile(r"midpoint_(?P<n>\d)_of_(upper|lower)_(lash|eyelid|crease)_line$"),
        {"1": "2", "2": "1", "3": "6", "4": "5", "5": "4", "6": "3"},
    ),
    (
        re.compile(r"^midpoint_(?P<n>\d)_of_(upper|lower)_(outer|inner)_lip$"),
        {"1": "2", "2": "1", "3": "6", "4": "5", "5": "4", "6": "3"},
    ),
    (re.compile(r"^(upper|lower)_midpoint_(?P<n>\d)_of_[lr]_eyebrow$"), {"2": "3", "3": "2"}),
    (re.compile(r"_point_(?P<n>\d)_of_inner_helix$"), {"2": "8", "8": "2"}),
    (re.compile(r"_border_of_(iris|pupil)_(?P<n>\d+)$"), {"3": "9", "9": "3"}),
    (
        re.compile(r"_border_of_(iris|pupil)_midpoint_(?P<n>\d)$"),
        {"1": "4", "4": "1", "2": "3", "3": "2"},
    ),
)


def mirror_name(name: str) -> str:
    """The name of the keypoint that lands on `name` when the image is mirrored left-right.

    Swaps the side words (`left`/`right`, `l`/`r`) and reverses face-contour numbering;
    points on the midline (nose, neck, chin, lip centres...) mirror to themselves.
    """
    mirrored = "_".join(_SIDE_SWAP.get(word, word) for word in name.split("_"))
    for pattern, renumbering in _CONTOUR_RENUMBERING:
        match = pattern.search(mirrored)
        if match is not None:
            start, end = match.span("n")
            number = match.group("n")
            mirrored = mirrored[:start] + renumbering.get(number, number) + mirrored[end:]
            break
    return mirrored


FLIP_INDICES: tuple[int, ...] = tuple(KEYPOINT_INDEX[mirror_name(name)] for name in KEYPOINT_NAMES)

_CENTRE: RGB = (51, 153, 255)
_LEFT_LIMB: RGB = (0, 255, 0)
_RIGHT_LIMB: RGB = (255, 128, 0)
_FINGER_COLORS: dict[str, RGB] = {
    "thumb": (255, 128, 0),
    "forefinger": (255, 153, 255),
    "middle_finger": (102, 178, 255),
    "ring_finger": (255, 51, 51),
    "pinky_finger": (0, 255, 0),
}


_L, _R, _C = _LEFT_LIMB, _RIGHT_LIMB, _CENTRE
# Limbs are coloured by side; torso and head links are the centre colour.
_BODY_LINKS: list[tuple[str, str, RGB]] = [
    ("left_ankle", "left_knee", _L),
    ("left_knee", "left_hip", _L),
    ("right_ankle", "right_knee", _R),
    ("right_knee", "right_hip", _R),
    ("left_hip", "right_hip", _C),
    ("left_shoulder", "left_hip", _C),
    ("right_shoulder", "right_hip", _C),
    ("left_shoulder", "right_shoulder", _C),
    ("left_shoulder", "left_elbow", _L),
    ("right_shoulder", "right_elbow", _R),
    ("left_elbow", "left_wrist", _L),
    ("right_elbow", "right_wrist", _R),
    ("left_eye", "right_eye", _C),
    ("nose", "left_eye", _C),
    ("nose", "right_eye", _C),
    ("left_eye", "left_ear", _C),
    ("right_eye", "right_ear", _C),
    ("left_ear", "left_shoulder", _C),
    ("right_ear", "right_shoulder", _C),
    *[
        (f"{side}_ankle", f"{side}_{part}", color)
        for side, color in (("left", _L), ("right", _R))
        for part in ("big_toe", "small_toe", "heel")
    ],
]


def _hand_links(side: str) -> list[tuple[str, str, RGB]]:
    """Wrist -> third joint -> 2 -> 3 -> 4 for each finger, coloured per finger."""
    links = []
    for finger in _FINGERS:
        chain = [f"{side}_wrist"] + [f"{side}_{finger}{j}" for j in ("_third_joint", "2", "3", "4")]
        links += [(a, b, _FINGER_COLORS[finger]) for a, b in pairwise(chain)]
    return links


_NAMED_LINKS: list[tuple[str, str, RGB]] = [
    *_BODY_LINKS,
    *_hand_links("left"),
    *_hand_links("right"),
]

SKELETON: tuple[tuple[int, int], ...] = tuple(
    (KEYPOINT_INDEX[a], KEYPOINT_INDEX[b]) for a, b, _ in _NAMED_LINKS
)
SKELETON_COLORS: tuple[RGB, ...] = tuple(color for _, _, color in _NAMED_LINKS)

# Per-keypoint drawing colours by region: (first index of the region, RGB).
_KEYPOINT_COLOR_REGIONS: tuple[tuple[int, RGB], ...] = (
    (0, (51, 153, 255)),  # body, feet, hands, arm extras, neck
    (70, (255, 255, 255)),  # face midline and eyebrows
    (96, (192, 64, 128)),  # left upper lash, eyelid and crease lines
    (120, (64, 32, 192)),  # right upper lines
    (144, (64, 192, 128)),  # left lower lines
    (161, (64, 192, 32)),  # right lower lines
    (178, (0, 192, 0)),  # nose
    (188, (192, 0, 0)),  # outer lips
    (204, (0, 192, 192)),  # inner lips
    (220, (200, 200, 0)),  # left ear
    (246, (0, 200, 200)),  # right ear
    (272, (128, 192, 64)),  # left iris
    (281, (192, 32, 64)),  # right iris
    (290, (192, 128, 64)),  # left pupil
    (299, (32, 192, 192)),  # right pupil
)


def _keypoint_colors() -> tuple[RGB, ...]:
    colors: list[RGB] = []
    for region, (start, color) in enumerate(_KEYPOINT_COLOR_REGIONS):
        stop = (
            _KEYPOINT_COLOR_REGIONS[region + 1][0]
            if region + 1 < len(_KEYPOINT_COLOR_REGIONS)
            else len(KEYPOINT_NAMES)
        )
        colors += [color] * (stop - start)
    return tuple(colors)


KEYPOINT_COLORS: tuple[RGB, ...] = _keypoint_colors()


# ----------------------------------------------------------------------------- v1 sets
# Sapiens v1 pose models predict one of three sets, told apart by their heatmap count
# (upstream `facebookresearch/sapiens`, `pose/configs/_base_/datasets/`): COCO 17,
# COCO-WholeBody 133 and Goliath 308 (the same 308 names and order as above).

COCO_KEYPOINT_NAMES: tuple[str, ...] = tuple(
    _words(
        """
        nose left_eye right_eye left_ear right_ear left_shoulder right_shoulder left_elbow
        right_elbow left_wrist right_wrist left_hip right_hip left_knee right_knee left_ankle
        right_ankle
        """
    )
)
_WHOLEBODY_FEET = _words("left_big_toe left_small_toe left_heel right_big_toe right_small_toe")
_WHOLEBODY_FEET.append("right_heel")


def _wholebody_hand(side: str) -> list[str]:
    """Root, then each finger base-first (1 ... 4), as COCO-WholeBody orders a hand."""
    return [f"{side}_hand_root"] + [f"{side}_{f}{j}" for f in _FINGERS for j in "1234"]


WHOLEBODY_KEYPOINT_NAMES: tuple[str, ...] = (
    *COCO_KEYPOINT_NAMES,
    *_WHOLEBODY_FEET,
    *(f"face-{i}" for i in range(68)),
    *_wholebody_hand("left"),
    *_wholebody_hand("right"),
)


def _face68_mirror(i: int) -> int:
    """The 68-point (iBUG) face landmark that `i` becomes in a mirrored image."""
    ranges = ((0, 16), (17, 26), (31, 35), (48, 54), (55, 59), (60, 64), (65, 67))
    for lo, hi in ranges:  # contours numbered across the face: reversed
        if lo <= i <= hi:
            return lo + hi - i
    eyes = {36: 45, 37: 44, 38: 43, 39: 42, 40: 47, 41: 46}
    eyes |= {v: k for k, v in eyes.items()}
    return eyes.get(i, i)  # 27-30, the nose bridge, is on the midline


def _flip_by_name(names: tuple[str, ...]) -> tuple[int, ...]:
    index = {name: i for i, name in enumerate(names)}
    flips = []
    for name in names:
        if name.startswith("face-"):
            flips.append(index[f"face-{_face68_mirror(int(name[5:]))}"])
        else:
            words = name.split("_")
            flips.append(index["_".join(_SIDE_SWAP.get(w, w) for w in words)])
    return tuple(flips)


COCO_FLIP_INDICES: tuple[int, ...] = _flip_by_name(COCO_KEYPOINT_NAMES)
WHOLEBODY_FLIP_INDICES: tuple[int, ...] = _flip_by_name(WHOLEBODY_KEYPOINT_NAMES)

# heatmap count -> (set name, names, flip indices)
KEYPOINT_SETS: MappingProxyType[int, tuple[str, tuple[str, ...], tuple[int, ...]]] = (
    MappingProxyType(
        {
            17: ("coco", COCO_KEYPOINT_NAMES, COCO_FLIP_INDICES),
            133: ("coco_wholebody", WHOLEBODY_KEYPOINT_NAMES, WHOLEBODY_FLIP_INDICES),
            308: ("goliath", KEYPOINT_NAMES, FLIP_INDICES),
        }
    )
)


def keypoint_names_for(count: int) -> tuple[str, ...]:
    """The names of a pose model's `count` heatmaps (17, 133 or 308)."""
    return _keypoint_set(count)[1]


def flip_indices_for(count: int) -> tuple[int, ...]:
    """Left/right mirror permutation of a pose model's `count` heatmaps (17, 133 or 308)."""
    return _keypoint_set(count)[2]


def _keypoint_set(count: int) -> tuple[str, tuple[str, ...], tuple[int, ...]]:
    found = KEYPOINT_SETS.get(count)
    if found is None:
        raise ValueError(f"no keypoint set has {count} points; known: {sorted(KEYPOINT_SETS)}")
    return found


def _wholebody_hand_links(side: str) -> list[tuple[str, str, RGB]]:
    """Root -> 1 -> 2 -> 3 -> 4 for each finger of a COCO-WholeBody hand."""
    links = []
    for finger in _FINGERS:
        chain = [f"{side}_hand_root"] + [f"{side}_{finger}{j}" for j in "1234"]
        links += [(a, b, _FINGER_COLORS[finger]) for a, b in pairwise(chain)]
    return links


_ALL_NAMED_LINKS = [
    *_NAMED_LINKS,
    *_wholebody_hand_links("left"),
    *_wholebody_hand_links("right"),
]


def skeleton_for(count: int) -> tuple[tuple[tuple[int, int], ...], tuple[RGB, ...]]:
    """The links (keypoint index pairs) of a `count`-point set and their colours: every
    named link whose two ends the set has (308: SKELETON; 17: the COCO body; 133: body, feet
    and hands)."""
    if count == len(KEYPOINT_NAMES):
        return SKELETON, SKELETON_COLORS
    index = {name: i for i, name in enumerate(keypoint_names_for(count))}
    links = {(a, b): c for a, b, c in _ALL_NAMED_LINKS if a in index and b in index}
    return tuple((index[a], index[b]) for a, b in links), tuple(links.values())


def keypoint_colors_for(count: int) -> tuple[RGB, ...]:
    """Drawing colours of a `count`-point set's keypoints (by region for 308, else one)."""
    return KEYPOINT_COLORS if count == len(KEYPOINT_NAMES) else (_CENTRE,) * count

"""The soft mattes of the `parts` pass (``schemas.passes``), declared apart from the table
for their length."""

from __future__ import annotations

from collections.abc import Mapping

# The soft mattes of `parts`: each the summed probability of its seg classes, by class name
# (so both families' class lists work; Sapiens v1 has no Eyeglass). Alphabetical, the order
# OpenEXR keeps a layer's channels in. Face_Neck is one class upstream: face includes the neck.
PART_GROUPS: Mapping[str, tuple[str, ...]] = {
    "clothing": (
        "Apparel", "Upper_Clothing", "Lower_Clothing", "Left_Shoe", "Right_Shoe", "Left_Sock",
        "Right_Sock",
    ),
    "face": (
        "Face_Neck", "Upper_Lip", "Lower_Lip", "Upper_Teeth", "Lower_Teeth", "Tongue",
        "Eyeglass",
    ),
    "hair": ("Hair",),
    "skin": (
        "Face_Neck", "Upper_Lip", "Lower_Lip", "Torso", "Left_Upper_Arm", "Right_Upper_Arm",
        "Left_Lower_Arm", "Right_Lower_Arm", "Left_Hand", "Right_Hand", "Left_Upper_Leg",
        "Right_Upper_Leg", "Left_Lower_Leg", "Right_Lower_Leg", "Left_Foot", "Right_Foot",
    ),
}  # fmt: skip

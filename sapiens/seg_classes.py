"""The 29 body-part classes of the segmentation head, in output-channel order (reference §2.5)."""

from __future__ import annotations

SEG_CLASSES: tuple[str, ...] = (
    "Background", "Apparel", "Eyeglass", "Face_Neck", "Hair", "Left_Foot", "Left_Hand",
    "Left_Lower_Arm", "Left_Lower_Leg", "Left_Shoe", "Left_Sock", "Left_Upper_Arm",
    "Left_Upper_Leg", "Lower_Clothing", "Right_Foot", "Right_Hand", "Right_Lower_Arm",
    "Right_Lower_Leg", "Right_Shoe", "Right_Sock", "Right_Upper_Arm", "Right_Upper_Leg",
    "Torso", "Upper_Clothing", "Lower_Lip", "Upper_Lip", "Lower_Teeth", "Upper_Teeth", "Tongue",
)  # fmt: skip
BACKGROUND = 0
assert len(SEG_CLASSES) == 29

# Sapiens v1 (Goliath seg, upstream `seg/mmseg/datasets/goliath.py`): 27 parts + background.
# No Eyeglass class, so every index after Apparel is one lower than in SEG_CLASSES.
V1_SEG_CLASSES: tuple[str, ...] = (
    "Background", "Apparel", "Face_Neck", "Hair", "Left_Foot", "Left_Hand", "Left_Lower_Arm",
    "Left_Lower_Leg", "Left_Shoe", "Left_Sock", "Left_Upper_Arm", "Left_Upper_Leg",
    "Lower_Clothing", "Right_Foot", "Right_Hand", "Right_Lower_Arm", "Right_Lower_Leg",
    "Right_Shoe", "Right_Sock", "Right_Upper_Arm", "Right_Upper_Leg", "Torso",
    "Upper_Clothing", "Lower_Lip", "Upper_Lip", "Lower_Teeth", "Upper_Teeth", "Tongue",
)  # fmt: skip
assert len(V1_SEG_CLASSES) == 28


def seg_classes_for(family: str) -> tuple[str, ...]:
    """The class names of a family's seg model, in output-channel order."""
    return V1_SEG_CLASSES if family == "sapiens1" else SEG_CLASSES

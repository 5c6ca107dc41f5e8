"""Opt-in `torch.compile` of the parts that pay for it: the transformer blocks (compiled per
block so MHSA and GQA blocks share compiled code across depth) and the head."""

from __future__ import annotations

from .backbone import Sapiens2Backbone
from .model import SapiensModel, SapiensTaskModel
from .v1_backbone import SapiensV1Backbone


def compile_model(model: SapiensModel, mode: str | None = None) -> SapiensModel:
    backbone = model.backbone if isinstance(model, SapiensTaskModel) else model
    if isinstance(backbone, SapiensV1Backbone):
        blocks = list(backbone.layers)  # v1: one block shape across depth
    else:
        assert isinstance(backbone, Sapiens2Backbone)
        blocks = list(backbone.blocks)
        if backbone.tokenizer is not None:
            blocks += list(backbone.tokenizer.blocks)
    for block in blocks:
        block.compile(mode=mode, dynamic=False)
    if isinstance(model, SapiensTaskModel):
        model.head_module.compile(mode=mode, dynamic=False)
    return model

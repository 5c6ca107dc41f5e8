"""Opt-in `torch.compile` of the parts that pay for it: the transformer blocks (compiled per
block so MHSA and GQA blocks share compiled code across depth) and the head."""

from __future__ import annotations

from .backbone import Sapiens2Backbone
from .model import SapiensModel


def compile_model(model: SapiensModel, mode: str | None = None) -> SapiensModel:
    backbone = model if isinstance(model, Sapiens2Backbone) else model.backbone
    for block in backbone.blocks:
        block.compile(mode=mode, dynamic=False)
    if backbone.tokenizer is not None:
        for block in backbone.tokenizer.blocks:
            block.compile(mode=mode, dynamic=False)
    head = getattr(model, "decode_head", None)
    if head is not None:
        head.compile(mode=mode, dynamic=False)
    return model

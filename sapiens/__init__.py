"""Sapiens2 for VFX: every backbone size (and the 4K tokenizer variant), every head, strict
loading of the released safetensors, pre/post-processing and a batched multi-task predictor.
Also the Sapiens v1 family (0.3b-2b; depth, normal, seg, pose), from converted safetensors.

Pure PyTorch + safetensors: this package knows nothing of files beyond checkpoints, nor of
Prefect or Dask.

Names are imported on first use (PEP 562), so code that needs only a light submodule (the
errors, the safetensors header reader) does not pay for importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "ARCH_NAMES": "arch",
    "TASKS": "arch",
    "BackboneSpec": "arch",
    "HeadSpec": "arch",
    "backbone_spec": "arch",
    "head_spec": "arch",
    "Sapiens2Backbone": "backbone",
    "CheckpointError": "errors",
    "InputError": "errors",
    "ModelInfo": "info",
    "load_model": "loading",
    "save_model": "loading",
    "SapiensModel": "model",
    "SapiensPretrainModel": "model",
    "SapiensTaskModel": "model",
    "SapiensV1PretrainModel": "model",
    "build_model": "model",
    "model_info": "model",
    "Predictor": "predictor",
    "SapiensV1Backbone": "v1_backbone",
    "V1_ARCH_NAMES": "v1_arch",
    "identify_v1": "v1_arch",
}
__all__ = [
    "ARCH_NAMES",
    "TASKS",
    "V1_ARCH_NAMES",
    "BackboneSpec",
    "CheckpointError",
    "HeadSpec",
    "InputError",
    "ModelInfo",
    "Predictor",
    "Sapiens2Backbone",
    "SapiensModel",
    "SapiensPretrainModel",
    "SapiensTaskModel",
    "SapiensV1Backbone",
    "SapiensV1PretrainModel",
    "backbone_spec",
    "build_model",
    "head_spec",
    "identify_v1",
    "load_model",
    "model_info",
    "save_model",
]

if TYPE_CHECKING:
    from .arch import ARCH_NAMES, TASKS, BackboneSpec, HeadSpec, backbone_spec, head_spec
    from .backbone import Sapiens2Backbone
    from .errors import CheckpointError, InputError
    from .info import ModelInfo
    from .loading import load_model, save_model
    from .model import (
        SapiensModel,
        SapiensPretrainModel,
        SapiensTaskModel,
        SapiensV1PretrainModel,
        build_model,
        model_info,
    )
    from .predictor import Predictor
    from .v1_arch import V1_ARCH_NAMES, identify_v1
    from .v1_backbone import SapiensV1Backbone


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sapiens' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

"""Sapiens2 for VFX: every backbone size (and the 4K tokenizer variant), every head, strict
loading of the released safetensors, pre/post-processing and a batched multi-task predictor.

Pure PyTorch + safetensors: this package knows nothing of files beyond checkpoints, nor of
Prefect or Dask.
"""

from .arch import ARCH_NAMES, TASKS, BackboneSpec, HeadSpec, backbone_spec, head_spec
from .backbone import InputError, Sapiens2Backbone
from .checkpoint_errors import CheckpointError
from .loading import load_model, save_model
from .model import ModelInfo, SapiensTaskModel, build_model, model_info
from .predictor import PASS_TASKS, Predictor

__all__ = [
    "ARCH_NAMES",
    "PASS_TASKS",
    "TASKS",
    "BackboneSpec",
    "CheckpointError",
    "HeadSpec",
    "InputError",
    "ModelInfo",
    "Predictor",
    "Sapiens2Backbone",
    "SapiensTaskModel",
    "backbone_spec",
    "build_model",
    "head_spec",
    "load_model",
    "model_info",
    "save_model",
]

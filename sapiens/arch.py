"""The Sapiens2 architecture table and per-arch head channel lists (reference §1.1, §2.2-2.6).

Everything a file does not say about itself lives here; `loading.py` infers the same facts
from a checkpoint's tensors and only uses this table to give the result a familiar name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PATCH_SIZE = 16
NUM_REGISTERS = 8  # upstream "storage tokens"; the prefix is [CLS, 8 registers]
NUM_PREFIX_TOKENS = 1 + NUM_REGISTERS
WINDOW_SIZE = 4  # 4K tokenizer window, in patches
ROPE_BASE = 100.0
LAYER_SCALE_INIT = 1e-4
NORM_EPS = 1e-6
NATIVE_INPUT_HW = (1024, 768)
CANONICAL_FOCAL = 768.0  # pointmap: the network predicts points for a 768 px focal camera

# The tasks a checkpoint can be made for, each spelled once (the v1 family adds DEPTH).
NORMAL = "normal"
ALBEDO = "albedo"
POINTMAP = "pointmap"
SEG = "seg"
POSE = "pose"
MATTING = "matting"
DEPTH = "depth"  # Sapiens v1's relative depth
TASKS = (NORMAL, ALBEDO, POINTMAP, SEG, POSE, MATTING)


@dataclass(frozen=True)
class BackboneSpec:
    """Shape of one backbone. `kv_heads[i]` is the number of K/V heads of block i.

    The last four fields describe Sapiens v1 backbones (`v1_arch.py`) and keep Sapiens2's
    defaults otherwise: v1 has an absolute position embedding stored for `pos_grid`, a patch
    conv padded by `patch_padding` pixels (2 for pose and normal, not visible in the shapes)
    and, in pretrain files, a `cls_token` with its slot in the position embedding."""

    name: str
    embed_dim: int
    depth: int
    num_heads: int
    kv_heads: tuple[int, ...]
    ffn_hidden: int
    tokenizer_depth: int = 0  # 0: no 4K tokenizer
    family: str = "sapiens2"  # or "sapiens1"
    patch_padding: int = 0
    pos_grid: tuple[int, int] = (0, 0)  # (0, 0): no absolute position embedding (RoPE)
    cls_token: bool = False  # v1 only; Sapiens2 always has its CLS and registers

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer_depth > 0

    @property
    def input_multiple(self) -> int:
        """Inputs must be a multiple of this many pixels per side."""
        return PATCH_SIZE * WINDOW_SIZE if self.has_tokenizer else PATCH_SIZE

    @property
    def arch_label(self) -> str:
        """The name a model of this backbone is reported under, e.g. 'sapiens2_1b_4k'."""
        return f"{self.name}_4k" if self.has_tokenizer and self.name != "custom" else self.name

    def validate(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{self.name}: width {self.embed_dim} not divisible by heads")
        if self.family == "sapiens2" and self.head_dim % 4:
            raise ValueError(f"{self.name}: head_dim {self.head_dim} must be a multiple of 4")
        if len(self.kv_heads) != self.depth:
            raise ValueError(f"{self.name}: {len(self.kv_heads)} kv entries for {self.depth}")
        for i, kv in enumerate(self.kv_heads):
            if kv <= 0 or self.num_heads % kv:
                raise ValueError(f"{self.name}: block {i} has {kv} kv heads for {self.num_heads}")


def upstream_kv_schedule(depth: int, heads: int, early: int = 8, late: int = 8) -> tuple[int, ...]:
    """Upstream GQA schedule: the first and last 8 blocks are full MHSA, the rest heads // 2."""
    return tuple(heads if (i < early or i >= depth - late) else heads // 2 for i in range(depth))


@dataclass(frozen=True)
class _ArchRow:
    embed_dim: int
    depth: int
    heads: int
    tokenizer_depth: int


# name: (C, layers, heads, tokenizer layers) from reference §1.1.
_ARCH_ROWS: dict[str, _ArchRow] = {
    "sapiens2_0.1b": _ArchRow(768, 12, 12, 2),
    "sapiens2_0.4b": _ArchRow(1024, 24, 16, 2),
    "sapiens2_0.8b": _ArchRow(1280, 32, 16, 3),
    "sapiens2_1b": _ArchRow(1536, 40, 24, 4),
    "sapiens2_5b": _ArchRow(2432, 56, 32, 6),
}


def _tiny_spec(tokenizer: bool) -> BackboneSpec:
    # Small enough for tests on a CPU, yet with MHSA and GQA blocks and a 4-wide head_dim/4.
    kv = (4, 4, 2, 2, 4, 4)
    return BackboneSpec("sapiens2_tiny", 64, 6, 4, kv, 256, 1 if tokenizer else 0)


ALIASES = {
    "tiny": "sapiens2_tiny",
    "0.1b": "sapiens2_0.1b",
    "0.4b": "sapiens2_0.4b",
    "0.8b": "sapiens2_0.8b",
    "1b": "sapiens2_1b",
    "5b": "sapiens2_5b",
    "1b-4k": "sapiens2_1b_4k",
    "sapiens2_1b-4k": "sapiens2_1b_4k",
}

ARCH_NAMES = (*_ARCH_ROWS, "sapiens2_tiny", "sapiens2_1b_4k")


def canonical_arch(arch: str) -> tuple[str, bool]:
    """Normalise an arch name; returns (base name, whether it names the 4K tokenizer variant)."""
    name = arch.strip().lower().replace("-4k", "_4k")
    name = ALIASES.get(name, name)
    if not name.startswith("sapiens2_"):
        name = f"sapiens2_{name}"
    tokenizer = False
    if name.endswith("_4k"):
        name, tokenizer = name[: -len("_4k")], True
    if name not in _ARCH_ROWS and name != "sapiens2_tiny":
        known = ", ".join(sorted(ALIASES))
        raise ValueError(f"unknown Sapiens2 arch {arch!r}; known: {known}")
    return name, tokenizer


def backbone_spec(arch: str, tokenizer: bool = False) -> BackboneSpec:
    name, named_4k = canonical_arch(arch)
    tokenizer = tokenizer or named_4k
    if name == "sapiens2_tiny":
        spec = _tiny_spec(tokenizer)
    else:
        row = _ARCH_ROWS[name]
        spec = BackboneSpec(
            name,
            row.embed_dim,
            row.depth,
            row.heads,
            upstream_kv_schedule(row.depth, row.heads),
            4 * row.embed_dim,
            row.tokenizer_depth if tokenizer else 0,
        )
    spec.validate()
    return spec


def name_for(embed_dim: int, depth: int, num_heads: int) -> str:
    """The released arch name with these dimensions, or 'custom'."""
    for name, row in _ARCH_ROWS.items():
        if (row.embed_dim, row.depth, row.heads) == (embed_dim, depth, num_heads):
            return name
    tiny = _tiny_spec(False)
    if (tiny.embed_dim, tiny.depth, tiny.num_heads) == (embed_dim, depth, num_heads):
        return tiny.name
    return "custom"


@dataclass(frozen=True)
class HeadSpec:
    """Channel lists of one task head. Unused fields stay empty for heads that lack them."""

    task: str
    in_channels: int
    out_channels: int
    upsample_channels: tuple[int, ...] = ()  # dense heads (PixelShuffle blocks)
    conv_channels: tuple[int, ...] = ()  # 3x3 convs (dense) or 1x1 convs (seg, pose)
    conv_kernel: int = 3
    deconv_channels: tuple[int, ...] = ()  # seg, pose (ConvTranspose2d k4 s2 p1)
    scale_conv_channels: tuple[int, ...] = ()  # pointmap scale branch
    scale_mlp: tuple[int, ...] = ()  # pointmap scale MLP, input features first
    extra: dict[str, str] = field(default_factory=dict)
    family: str = "sapiens2"  # or "sapiens1" (v1 deconv heads, `v1_arch.py`)


_DENSE_SMALL = ((768, 512, 256, 128), (64, 32, 16))
_DENSE_5B = ((1536, 768, 512, 256), (128, 64, 32))
_TINY_DENSE = ((32, 16, 16, 8), (8, 8))


def head_spec(
    arch: str, task: str, in_channels: int, input_hw: tuple[int, int] = NATIVE_INPUT_HW
) -> HeadSpec:
    """The head upstream builds for `task` on `arch` (tiny gets a small head of the same kind)."""
    name, _ = canonical_arch(arch)
    tiny = name == "sapiens2_tiny"
    is5b = name == "sapiens2_5b"
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if task in (NORMAL, ALBEDO, MATTING):
        up, conv = _TINY_DENSE if tiny else (_DENSE_5B if is5b else _DENSE_SMALL)
        if task == ALBEDO and is5b:
            conv = (64, 32, 16)
        out = 4 if task == MATTING else 3
        return HeadSpec(task, in_channels, out, upsample_channels=up, conv_channels=conv)
    if task == POINTMAP:
        if tiny:
            up, conv, scale_convs = _TINY_DENSE[0], _TINY_DENSE[1], (32, 16, 8)
        elif is5b:
            up, conv, scale_convs = (1536, 768, 768, 768), (128, 64, 32), (1536, 512, 128)
        else:
            up, conv, scale_convs = (1536, 768, 512, 256), (64, 32, 16), (1536, 512, 128)
        grid_h, grid_w = scale_grid(input_hw)
        features = scale_convs[-1] * grid_h * grid_w
        mlp = (features, 32, 16, 1) if tiny else (features, 512, 128, 1)
        return HeadSpec(
            task,
            in_channels,
            3,
            upsample_channels=up,
            conv_channels=conv,
            scale_conv_channels=scale_convs,
            scale_mlp=mlp,
        )
    if task == SEG:
        deconv = (32, 16, 16, 8) if tiny else (512, 256, 128, 64)
        conv = (8, 8) if tiny else (64, 64)
        return HeadSpec(
            task, in_channels, 29, deconv_channels=deconv, conv_channels=conv, conv_kernel=1
        )
    # pose
    if tiny:
        deconv, conv = (32, 16), (16, 16, 8)
    elif name == "sapiens2_1b":
        deconv, conv = (1536, 1024), (768, 512, 256)
    else:
        deconv, conv = (1024, 768), (512, 512, 256)
    return HeadSpec(
        task, in_channels, 308, deconv_channels=deconv, conv_channels=conv, conv_kernel=1
    )


def scale_grid(input_hw: tuple[int, int]) -> tuple[int, int]:
    """Spatial size after the pointmap scale branch's three stride-2 1x1 convs."""
    h, w = input_hw[0] // PATCH_SIZE, input_hw[1] // PATCH_SIZE
    for _ in range(3):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    return h, w

"""The deconvolution heads' bounded-memory inference forward gives the plain forward's
outputs: bands of rows of every size, images in groups, fp32 and bf16, v1 and Sapiens2."""

from __future__ import annotations

import pytest
import torch

from sapiens import lean_head
from sapiens.arch import head_spec
from sapiens.heads import DeconvHead, build_head
from sapiens.v1_arch import v1_head_spec
from tests.model_helpers import rel_err


def _plain(head: DeconvHead, feats: torch.Tensor) -> torch.Tensor:
    """The layers one after another, as upstream runs them (with gradients on, the head's
    forward takes this path itself)."""
    with torch.enable_grad():
        return head(feats).detach()


def _lean(head: DeconvHead, feats: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return head(feats)


V1_HEADS = [
    v1_head_spec(task, 24, deconv=(16, 8, 8), conv=(8, 8)) for task in ("depth", "seg", "pose")
]
SAPIENS2_HEADS = [head_spec("sapiens2_tiny", task, 24) for task in ("seg", "pose")]


@pytest.mark.parametrize("spec", V1_HEADS + SAPIENS2_HEADS, ids=lambda s: f"{s.family}-{s.task}")
@pytest.mark.parametrize("band_bytes", [1, 700, 4096, lean_head.BAND_BYTES])
@pytest.mark.parametrize("grid", [(1, 1), (4, 3), (5, 7)])
def test_lean_forward_equals_the_plain_one(
    spec, band_bytes: int, grid: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lean_head, "BAND_BYTES", band_bytes)
    monkeypatch.setattr(lean_head, "GROUP_BYTES", 1)  # one image at a time
    torch.manual_seed(0)
    head = build_head(spec).eval()
    feats = torch.randn(3, 24, *grid)
    before = feats.clone()
    ours, ref = _lean(head, feats), _plain(head, feats)
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) < 1e-5
    assert torch.equal(feats, before)  # the caller's features are not overwritten


def test_bands_cover_every_output_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deconvolution computed one output row at a time equals the whole one exactly where
    each row is summed from the same terms: a constant input makes every sum exact."""
    monkeypatch.setattr(lean_head, "BAND_BYTES", 1)
    layer = torch.nn.ConvTranspose2d(2, 3, 4, stride=2, padding=1, bias=False)
    torch.nn.init.constant_(layer.weight, 0.25)
    x = torch.ones(1, 2, 5, 4)
    with torch.inference_mode():
        assert torch.equal(lean_head._deconv(layer, x), layer(x))


def test_bf16_stays_within_bf16_rounding_of_fp32() -> None:
    torch.manual_seed(1)
    spec = V1_HEADS[0]
    head = build_head(spec).eval()
    feats = torch.randn(2, 24, 4, 3)
    ref = _plain(head, feats)
    low = build_head(spec).eval()
    low.load_state_dict(head.state_dict())
    low = low.to(torch.bfloat16)
    plain_err = rel_err(_plain(low, feats.bfloat16()).float(), ref)
    lean_err = rel_err(_lean(low, feats.bfloat16()).float(), ref)
    assert lean_err < max(2 * plain_err, 2e-2)


def test_groups_follow_the_largest_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """Images go through together while their largest map fits GROUP_BYTES."""
    spec = V1_HEADS[0]
    head = build_head(spec).eval()
    seen: list[int] = []
    real = lean_head._run

    def spy(*args):
        seen.append(args[-1].shape[0])
        return real(*args)

    monkeypatch.setattr(lean_head, "_run", spy)
    feats = torch.randn(5, 24, 4, 3)
    per_image = 8 * 32 * 24 * 4  # the last deconv: 8 channels at 8x the 4x3 grid, fp32
    monkeypatch.setattr(lean_head, "GROUP_BYTES", 2 * per_image)
    _lean(head, feats)
    assert seen == [2, 2, 1]


def test_an_empty_batch_gives_an_empty_output() -> None:
    head = build_head(V1_HEADS[0]).eval()
    feats = torch.randn(0, 24, 4, 3)
    assert _lean(head, feats).shape == _plain(head, feats).shape == (0, 1, 32, 24)

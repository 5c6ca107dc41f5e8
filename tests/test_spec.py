"""ShotSpec validation, allowed roots, cache keys and settings."""

from __future__ import annotations

import pytest

from schemas.settings import Settings
from schemas.spec import ShotSpec, SpecError, cache_key, check_paths, is_under, parse_spec

BASE = {"plate": "/shows/x/plate.####.exr", "show": "x", "sequence": "sq", "shot": "sh010"}


def test_defaults_ask_for_every_pass_in_canonical_order():
    spec = parse_spec({**BASE, "passes": "pose,normal,seg"})
    assert spec.passes == ("normal", "seg", "pose")
    assert parse_spec(BASE).passes == ("normal", "pointmap", "albedo", "matte", "seg", "pose")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"passes": "normal,shadow"}, "unknown pass 'shadow'"),
        ({"model_size": "3b"}, "unknown model size '3b'"),
        ({"family": "sapiens3"}, "family"),
        ({"shot": "sh 010"}, "not a usable name"),
        ({"frames": "1001-abc"}, "frame range"),
        ({"version": "final"}, "must look like v001"),
        ({"tiling": {"tile_width": 256, "tile_height": 256, "overlap": 200}}, "too large"),
        ({"tiling": {"tile_width": 256}}, "give both"),
        ({"colour": "acescg"}, "colour"),  # a typo of a field name is refused, not ignored
        ({"passes": ""}, "no passes"),
    ],
)
def test_bad_specs_name_the_field_and_the_problem(change, message):
    with pytest.raises(SpecError) as info:
        parse_spec({**BASE, **change})
    assert message in str(info.value)


def test_pose_alone_runs_seg_for_person_boxes_but_only_writes_pose():
    spec = parse_spec({**BASE, "passes": "pose"})
    assert spec.passes == ("pose",)
    assert spec.model_passes == ("seg", "pose")
    assert parse_spec({**BASE, "passes": "matte,pose"}).model_passes == ("matte", "pose")


def test_temporal_takes_both_spellings_and_stores_the_first():
    """``stabilise`` is taken for ``stabilize``, the value catalogs store and the API answers."""
    for spelling in ("stabilize", "stabilise"):
        spec = parse_spec({**BASE, "temporal": spelling})
        assert spec.temporal == "stabilize" and spec.stabilises_after
        assert spec.model_dump(mode="json")["temporal"] == "stabilize"
    assert not parse_spec(BASE).stabilises_after
    with pytest.raises(SpecError, match="temporal"):
        parse_spec({**BASE, "temporal": "stabilised"})


def test_paths_must_lie_under_allowed_roots():
    spec = parse_spec({**BASE, "output_root": "/shows/x/out"})
    assert check_paths(spec, ["/shows"], "/unused") == []
    problems = check_paths(spec, ["/shows/y"], "/unused")
    assert len(problems) == 2 and "SVFX_ALLOWED_ROOTS" in problems[0]
    sneaky = parse_spec({**BASE, "plate": "/shows/x/../../etc/plate.####.exr"})
    assert any("plate" in p for p in check_paths(sneaky, ["/shows"], "/shows/out"))


def test_is_under_handles_schemes_and_prefix_names():
    assert is_under("s3://bucket/a/b.exr", "s3://bucket")
    assert not is_under("s3://bucket2/a", "s3://bucket")
    assert not is_under("/shows-other/a", "/shows")
    assert not is_under("s3://bucket/a", "/bucket")
    assert is_under("file:///shows/a", "/shows")


def test_cache_key_changes_with_plate_checkpoint_and_settings():
    spec = ShotSpec(**BASE)
    key = cache_key("p" * 64, ["b", "a"], spec.settings_digest())
    assert key == cache_key("p" * 64, ["a", "b"], spec.settings_digest())  # order-free
    assert key != cache_key("q" * 64, ["a", "b"], spec.settings_digest())
    assert key != cache_key("p" * 64, ["a", "c"], spec.settings_digest())
    other = ShotSpec(**BASE, tiling={"overlap": 64})
    assert other.settings_digest() != spec.settings_digest()
    # bookkeeping fields do not change pixels, so they do not change the key
    assert ShotSpec(**BASE, chunk_frames=3).settings_digest() == spec.settings_digest()


def test_settings_from_env_and_toml(tmp_path, monkeypatch):
    toml = 'catalog_url = "sqlite:///from-toml.db"\nlocal_workers = 3\n'
    (tmp_path / "svfx.toml").write_text(toml)
    monkeypatch.setenv("SVFX_CONFIG", str(tmp_path / "svfx.toml"))
    monkeypatch.setenv("SVFX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SVFX_LOCAL_WORKERS", "5")  # the environment wins over the file
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", "/shows,s3://plates/incoming")
    settings = Settings()
    assert settings.catalog == "sqlite:///from-toml.db"
    assert settings.local_workers == 5
    assert settings.roots == ["/shows", "s3://plates/incoming"]
    assert settings.outputs == str(tmp_path / "home" / "outputs")

"""The scheduled bucket scan (`svfx serve`) takes the EXR layout and the tiles setting as `svfx
scan --exr-layout/--tiles` does: SVFX_SCAN_EXR_LAYOUT and SVFX_SCAN_TILES, with the ShotSpec
fields' values, defaults and meanings, reach the served scan-plates deployment and every shot
that scan submits."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from flows import scheduled
from flows.scan import ScanReport
from schemas.settings import Settings, load_settings
from schemas.spec import ShotSpec

# spec field, its default, another value, a value it refuses
SETTINGS = [("exr_layout", "multipart", "single", "flat"), ("tiles", "people", "all", "some")]


@pytest.mark.parametrize(("name", "default", "other", "bad"), SETTINGS)
def test_the_setting_is_the_spec_fields_declaration(
    monkeypatch: pytest.MonkeyPatch, name: str, default: str, other: str, bad: str
) -> None:
    field = ShotSpec.model_fields[name]
    setting = Settings.model_fields[f"scan_{name}"]
    assert setting.default == field.default == default
    assert setting.description == field.description
    monkeypatch.setenv(f"SVFX_SCAN_{name.upper()}", other)
    assert getattr(load_settings(), f"scan_{name}") == other
    monkeypatch.setenv(f"SVFX_SCAN_{name.upper()}", bad)
    with pytest.raises(ValidationError, match=f"scan_{name}"):
        load_settings()


@pytest.mark.parametrize(("name", "default", "other", "bad"), SETTINGS)
def test_the_served_scan_deployment_passes_the_setting(
    name: str, default: str, other: str, bad: str
) -> None:
    for value in (default, other):
        settings = Settings(scan_prefixes=["s3://bucket/prefix"], **{f"scan_{name}": value})
        served = {d.name: d for d in scheduled.deployments(settings)}
        assert served[scheduled.SCAN_DEPLOYMENT].parameters[name] == value


@pytest.mark.parametrize(("name", "default", "other", "bad"), SETTINGS)
def test_the_scan_flow_asks_every_shot_for_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, default: str, other: str, bad: str
) -> None:
    seen: dict[str, Any] = {}

    def fake_scan(prefixes, template, *, settings, submitter, defaults, dry_run):
        seen["defaults"] = defaults
        return ScanReport(prefixes=prefixes, template=template, dry_run=dry_run), []

    monkeypatch.setattr(scheduled, "scan_with_catalog", fake_scan)
    monkeypatch.setattr(scheduled, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(scheduled, "create_markdown_artifact", lambda **kw: None)
    template = "{show}/{seq}/{shot}/{name}.####.exr"
    scheduled.scan_plates.fn(["s3://b/p"], template, dry_run=True)
    assert getattr(seen["defaults"], name) == default  # ShotSpec's default
    scheduled.scan_plates.fn(["s3://b/p"], template, dry_run=True, **{name: other})
    assert getattr(seen["defaults"], name) == other

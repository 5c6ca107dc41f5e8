"""The scheduled bucket scan (`svfx serve`) takes the EXR layout as `svfx scan --exr-layout`
does: SVFX_SCAN_EXR_LAYOUT, with ShotSpec.exr_layout's values, default and meaning, reaches
the served scan-plates deployment and every shot that scan submits."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from flows import scheduled
from flows.scan import ScanReport
from schemas.settings import Settings, load_settings
from schemas.spec import ShotSpec


def test_the_setting_is_the_spec_fields_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    field = ShotSpec.model_fields["exr_layout"]
    setting = Settings.model_fields["scan_exr_layout"]
    assert setting.default == field.default == "multipart"
    assert setting.description == field.description
    monkeypatch.setenv("SVFX_SCAN_EXR_LAYOUT", "single")
    assert load_settings().scan_exr_layout == "single"
    monkeypatch.setenv("SVFX_SCAN_EXR_LAYOUT", "flat")
    with pytest.raises(ValidationError, match="scan_exr_layout"):
        load_settings()


@pytest.mark.parametrize("layout", ["single", "multipart"])
def test_the_served_scan_deployment_passes_the_layout(layout: str) -> None:
    settings = Settings(scan_prefixes=["s3://bucket/prefix"], scan_exr_layout=layout)
    served = {d.name: d for d in scheduled.deployments(settings)}
    assert served[scheduled.SCAN_DEPLOYMENT].parameters["exr_layout"] == layout


def test_the_scan_flow_asks_every_shot_for_its_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_scan(prefixes, template, *, settings, submitter, defaults, dry_run):
        seen["defaults"] = defaults
        return ScanReport(prefixes=prefixes, template=template, dry_run=dry_run), []

    monkeypatch.setattr(scheduled, "scan_with_catalog", fake_scan)
    monkeypatch.setattr(scheduled, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(scheduled, "create_markdown_artifact", lambda **kw: None)
    scheduled.scan_plates.fn(["s3://b/p"], "{show}/{seq}/{shot}/{name}.####.exr", dry_run=True)
    assert seen["defaults"].exr_layout == "multipart"  # ShotSpec's default
    scheduled.scan_plates.fn(
        ["s3://b/p"], "{show}/{seq}/{shot}/{name}.####.exr", exr_layout="single", dry_run=True
    )
    assert seen["defaults"].exr_layout == "single"

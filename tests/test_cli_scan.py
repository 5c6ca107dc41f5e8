"""`svfx scan`, `svfx serve` and `svfx api` from the command line (CliRunner, moto S3).

The scan's own work is tested in test_scan.py and test_scan_flow.py; here: what the command
prints and returns, that --dry-run submits nothing and says plainly when there is nothing new,
that a bad template or an unlistable prefix exits 2, and what `serve` hands to Prefect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import s3fs

from tests.test_cli import as_json, invoke, why

TEMPLATE = "{show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket, s3_endpoint, prefect_api):
    url, options = s3_bucket
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", f"{tmp_path},{url}")
    monkeypatch.setenv("SVFX_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    for name in ("SVFX_CATALOG_URL", "SVFX_SCAN_PREFIXES", "SVFX_OUTPUT_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return url, s3fs.S3FileSystem(**options)


def test_dry_run_prints_what_it_would_submit_and_the_unmatched_keys(env, monkeypatch):
    url, fs = env
    fs.pipe({f"{url}/ab/sq010/sh010/plates/bg01/p.{f}.exr": b"x" for f in (1001, 1002)})
    fs.pipe({f"{url}/ab/sq010/sh010/plates/bg01/Thumbs.db": b"x"})

    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("a dry run must not submit")

    monkeypatch.setattr("flows.submission.InlineSubmitter.submit", never)
    result = invoke("scan", url, "--template", TEMPLATE, "--dry-run", "--settle", "0")
    assert result.exit_code == 0, why(result)
    assert "would submit (new): ab/sq010/sh010/bg01" in result.stdout
    assert "[2 frames]" in result.stdout
    assert "1 objects do not match" in result.stdout and "Thumbs.db" in result.stdout

    report = as_json(invoke("scan", url, "--template", TEMPLATE, "--dry-run", "--json"))
    # the default settle time holds back objects written a moment ago
    assert report["counts"] == {"settling": 1} and report["dry_run"] is True


def test_nothing_new_is_said_plainly(env):
    url, _ = env
    result = invoke("scan", url, "--template", TEMPLATE, "--dry-run")
    assert result.exit_code == 0, why(result)
    assert "nothing new" in result.stdout and "0 objects" in result.stdout


def test_bad_template_and_unlistable_prefix_exit_2(env, monkeypatch):
    url, _ = env
    result = invoke("scan", url, "--template", "{show}/{shot}/p.####.exr", "--dry-run")
    assert result.exit_code == 2 and "lacks {seq}" in result.stderr, why(result)

    from storage import object_listing

    def throttled(*_: Any, **__: Any) -> Any:
        raise object_listing.ListingError("listing s3://x: gave up after 8 attempts: SlowDown")

    monkeypatch.setattr("flows.scan.list_objects", throttled)
    result = invoke("scan", url, "--template", TEMPLATE, "--dry-run")
    assert result.exit_code == 2, why(result)
    assert "SlowDown" in result.stderr


def test_serve_hands_both_deployments_to_prefect(env, monkeypatch):
    url, _ = env
    monkeypatch.setenv("SVFX_SCAN_PREFIXES", f"{url}/incoming,{url}/more")
    monkeypatch.setenv("SVFX_SCAN_CRON", "*/5 * * * *")
    served: list[Any] = []
    monkeypatch.setattr("prefect.serve", lambda *deployments, **_: served.extend(deployments))
    result = invoke("serve")
    assert result.exit_code == 0, why(result)
    assert [d.name for d in served] == ["process-shot", "scan-plates"]
    scan = served[1]
    assert scan.parameters["prefixes"] == [f"{url}/incoming", f"{url}/more"]
    assert scan.schedules[0].schedule.cron == "*/5 * * * *"

    served.clear()
    monkeypatch.delenv("SVFX_SCAN_PREFIXES")
    result = invoke("serve")
    assert [d.name for d in served] == ["process-shot"]
    assert "no SVFX_SCAN_PREFIXES" in result.stderr


def test_api_command_runs_the_app_on_the_given_address(env, monkeypatch):
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr("api.app.run_api", lambda host, port, settings: calls.append((host, port)))
    result = invoke("api", "--host", "0.0.0.0", "--port", "8123")
    assert result.exit_code == 0, why(result)
    assert calls == [("0.0.0.0", 8123)]


def test_a_scan_processes_a_new_plate_then_finds_nothing_new(env, tmp_path):
    """Inline, as an artist or a cron job would run it: exit 0, outputs in the bucket; the
    second scan submits nothing."""
    from tests.shot_helpers import make_plate

    url, fs = env
    local = Path(make_plate(tmp_path / "plates", frames=2)).parent
    for path in sorted(local.glob("*.exr")):
        fs.put_file(str(path), f"{url}/ab/sq010/sh010/plates/bg01/{path.name}")
    args = ["scan", url, "--template", TEMPLATE, "--settle", "0", "--output", f"{url}/out"]
    args += ["--colorspace", "lin_rec709", "--passes", "normal,matte"]
    result = invoke(*args)
    assert result.exit_code == 0, why(result)
    assert "submitted (new): ab/sq010/sh010/bg01" in result.stdout
    exrs = fs.glob(f"{url}/out/ab/sq010/sh010/bg01/sapiens2_v001/*.exr")
    assert len(exrs) == 2

    again = invoke(*args)
    assert again.exit_code == 0, why(again)
    assert "nothing new" in again.stdout


def test_a_scan_whose_only_sequence_is_refused_names_it_and_exits_2(env, tmp_path_factory):
    """A sequence whose outputs would go outside the allowed roots: named with the reason,
    counted, exit 2; never 'nothing new', never a traceback."""
    url, fs = env
    fs.pipe({f"{url}/ab/sq010/sh010/plates/bg01/p.{f}.exr": b"x" for f in (1001, 1002)})
    outside = tmp_path_factory.mktemp("not_an_allowed_root")
    args = ["scan", url, "--template", TEMPLATE, "--settle", "0", "--output", str(outside)]
    result = invoke(*args)
    assert result.exit_code == 2, why(result)
    assert "rejected: ab/sq010/sh010/bg01" in result.stdout
    assert "outside the allowed roots" in result.stdout and str(outside) in result.stdout
    assert "1 sequences refused" in result.stdout
    assert "nothing new" not in result.stdout
    assert "Traceback" not in result.stdout + result.stderr

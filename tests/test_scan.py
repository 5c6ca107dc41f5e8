"""The bucket scan against moto's S3 server: templates, the catalog comparison, in-flight
dedupe, the cap, settling uploads, listing retries and what the report names."""

from __future__ import annotations

import time
from typing import Any

import pytest
import s3fs

from flows.plate_template import PlateTemplate, TemplateError
from flows.scan import ScanDefaults, scan_bucket
from flows.submission import plate_key
from schemas.catalog import open_catalog
from schemas.settings import Settings
from schemas.spec import ShotSpec
from storage.location import Location
from storage.object_listing import ListingError, list_objects
from storage.retry import RetryPolicy, with_retries

TEMPLATE = "{show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"


# -- templates ----------------------------------------------------------------------------------
def test_template_matches_whole_keys_and_names_the_frame():
    tpl = PlateTemplate.parse(TEMPLATE)
    found = tpl.match("ab/sq010/sh010/plates/bg01/ab_sh010.bg01.v002.1001.exr")
    assert found is not None
    assert found.fields == {
        "show": "ab",
        "seq": "sq010",
        "shot": "sh010",
        "plate": "bg01",
        "name": "ab_sh010.bg01.v002",
    }
    assert found.frame == 1001
    assert found.pattern == "ab/sq010/sh010/plates/bg01/ab_sh010.bg01.v002.####.exr"
    assert tpl.match("ab/sq010/sh010/plates/bg01/plate.10000.exr").frame == 10000  # overflow
    for key in (
        "ab/sq010/sh010/plates/bg01/plate.101.exr",  # under the padding
        "ab/sq010/sh010/plates/bg01/plate.1001.dpx",  # other extension
        "ab/sq010/sh010/plates/bg01/sub/plate.1001.exr",  # one folder too deep
        "ab/sq010/sh010/renders/bg01/plate.1001.exr",  # literal differs
        "ab/sq010/sh010/plates/bg01/plate.1001.exr.tmp",
    ):
        assert tpl.match(key) is None, key


def test_template_tokens_and_aliases():
    tpl = PlateTemplate.parse("{show}/{sequence}/{shot}/{element}.%04d.exr")
    found = tpl.match("s/q/h/fg.0042.exr")
    assert found and found.fields == {"show": "s", "seq": "q", "shot": "h", "plate": "fg"}
    assert found.pattern == "s/q/h/fg.%04d.exr"
    lone = PlateTemplate.parse("{show}/{seq}/{shot}/p.#.exr")
    assert lone.match("a/b/c/p.0001.exr") and not lone.match("a/b/c/p.1.exr")
    assert PlateTemplate.parse("{show}/{seq}/{shot}/p.@.exr").match("a/b/c/p.7.exr").frame == 7


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("", "empty"),
        ("{show}/{seq}/{shot}/plate.exr", "exactly one frame token"),
        ("{show}/{seq}/{shot}/p.####.####.exr", "exactly one frame token"),
        ("{show}/{shot}/p.####.exr", "lacks {seq}"),
        ("{show}/{seq}/{shot}/{shot}.####.exr", "twice"),
    ],
)
def test_bad_templates_say_why(template, reason):
    with pytest.raises(TemplateError, match=reason):
        PlateTemplate.parse(template)


# -- retries ------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def test_transient_errors_are_retried_with_backoff_then_succeed():
    clock, calls = _Clock(), []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise OSError("SlowDown: Please reduce your request rate")
        return "listed"

    policy = RetryPolicy(attempts=8, first_wait_s=0.5, max_wait_s=4, deadline_s=60)
    assert with_retries(flaky, "listing s3://b/p", policy, clock.sleep, clock) == "listed"
    assert len(calls) == 4 and len(clock.sleeps) == 3
    assert all(0 <= s <= cap for s, cap in zip(clock.sleeps, (0.5, 1.0, 2.0), strict=True))


def test_retries_stop_at_the_deadline_and_name_the_prefix():
    clock = _Clock()

    def throttled() -> None:
        clock.now += 3.0  # each request takes 3 s before failing
        raise OSError("503 Service Unavailable")

    policy = RetryPolicy(attempts=100, first_wait_s=1, max_wait_s=2, deadline_s=10)
    with pytest.raises(ListingError, match=r"listing s3://b/p: gave up after \d attempts") as info:
        with_retries(throttled, "listing s3://b/p", policy, clock.sleep, clock, ListingError)
    assert "503" in str(info.value)
    assert clock.now < 10 + 3 + 2  # never starts a wait that would end past the deadline


def test_permanent_errors_are_not_retried():
    clock, calls = _Clock(), []

    def forbidden() -> None:
        calls.append(1)
        raise PermissionError("AccessDenied")

    with pytest.raises(PermissionError):
        with_retries(forbidden, "x", RetryPolicy(), clock.sleep, clock)
    assert calls == [1] and clock.sleeps == []


def test_a_throttled_frame_read_waits_then_a_dead_store_fails_that_frame(s3_bucket, monkeypatch):
    from storage import plate_reader as readers
    from storage.errors import FrameError

    url, options = s3_bucket
    s3fs.S3FileSystem(**options).pipe(f"{url}/p.1001.exr", b"pixels")
    monkeypatch.setattr(readers, "READ_RETRY", RetryPolicy(attempts=4, first_wait_s=0.01))
    real, failures = s3fs.S3FileSystem.cat_file, []

    def throttled(self: s3fs.S3FileSystem, path: str, *args: Any, **kwargs: Any) -> bytes:
        if len(failures) < 2:
            failures.append(path)
            raise OSError("SlowDown: Please reduce your request rate")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "cat_file", throttled)
    assert readers.fetch_bytes(Location(f"{url}/p.1001.exr", options), frame=1001) == b"pixels"
    assert len(failures) == 2

    def down(self: s3fs.S3FileSystem, path: str, *args: Any, **kwargs: Any) -> bytes:
        raise OSError("503 Service Unavailable")

    monkeypatch.setattr(s3fs.S3FileSystem, "cat_file", down)
    with pytest.raises(FrameError, match=r"frame 1001.*gave up after 4 attempts.*503"):
        readers.fetch_bytes(Location(f"{url}/p.1001.exr", options), frame=1001)


# -- scanning a bucket ----------------------------------------------------------------------------
def scan(prefixes: list[str], catalog: Any, submitter: Any, settings: Settings, **options: Any):
    return scan_bucket(
        prefixes, TEMPLATE, catalog=catalog, submitter=submitter, settings=settings, **options
    )


class FakeSubmitter:
    def __init__(self, running: dict[str, str] | None = None) -> None:
        self.running = running or {}
        self.specs: list[ShotSpec] = []

    def in_flight(self) -> dict[str, str]:
        return dict(self.running)

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        self.specs.append(spec)
        return f"run-{len(self.specs)}"


@pytest.fixture
def bucket(s3_bucket, tmp_path, monkeypatch):
    url, options = s3_bucket
    endpoint = options["client_kwargs"]["endpoint_url"]
    monkeypatch.setenv("SVFX_S3_ENDPOINT_URL", endpoint)
    settings = Settings(home=tmp_path, allowed_roots=[str(tmp_path), url], s3_endpoint_url=endpoint)
    return url, s3fs.S3FileSystem(**options), settings


def _put(fs: s3fs.S3FileSystem, url: str, keys: list[str], body: bytes = b"x") -> None:
    fs.pipe({f"{url}/{key}": body for key in keys})


def _shot_keys(shot: str, frames: range, plate: str = "bg01") -> list[str]:
    return [f"ab/sq010/{shot}/plates/{plate}/{shot}_{plate}.{f:04d}.exr" for f in frames]


def test_dry_run_lists_new_sequences_and_unmatched_objects_and_submits_nothing(bucket, tmp_path):
    url, fs, settings = bucket
    _put(fs, url, _shot_keys("sh010", range(1001, 1004)) + _shot_keys("sh020", range(1, 3)))
    _put(fs, url, ["ab/sq010/sh010/plates/bg01/notes.txt", "ab/readme.md"])
    catalog, submitter = open_catalog(f"sqlite:///{tmp_path / 'c.db'}"), FakeSubmitter()

    report = scan(
        [url + "/ab"],
        catalog,
        submitter,
        settings,
        defaults=ScanDefaults(settle_seconds=0),
        dry_run=True,
    )
    # the prefix is inside the show folder, so nothing matches a template that starts at it
    assert report.sequences == [] and len(report.unmatched) == 7

    report = scan(
        [url], catalog, submitter, settings, defaults=ScanDefaults(settle_seconds=0), dry_run=True
    )
    assert submitter.specs == []  # a dry run submits nothing
    assert report.objects == 7
    assert [(d.shot, d.action, d.frames) for d in report.sequences] == [
        ("ab/sq010/sh010/bg01", "new", 3),
        ("ab/sq010/sh020/bg01", "new", 2),
    ]
    assert sorted(report.unmatched) == [
        f"{url}/ab/readme.md",
        f"{url}/ab/sq010/sh010/plates/bg01/notes.txt",
    ]
    assert report.sequences[0].plate == f"{url}/ab/sq010/sh010/plates/bg01/sh010_bg01.####.exr"


def test_in_flight_plates_are_not_submitted_again_and_the_cap_holds(bucket, tmp_path):
    url, fs, settings = bucket
    for shot in ("sh010", "sh020", "sh030"):
        _put(fs, url, _shot_keys(shot, range(1001, 1003)))
    catalog = open_catalog(f"sqlite:///{tmp_path / 'c.db'}")
    running = plate_key(f"{url}/ab/sq010/sh010/plates/bg01/sh010_bg01.####.exr")
    submitter = FakeSubmitter({running: "run-elsewhere"})

    report = scan(
        [url],
        catalog,
        submitter,
        settings,
        defaults=ScanDefaults(settle_seconds=0, max_in_flight=2, exr_layout="single"),
    )
    actions = {d.shot.split("/")[2]: d.action for d in report.sequences}
    # sh010 runs already (one of the 2 slots), sh020 takes the other, sh030 waits
    assert actions == {"sh010": "in flight", "sh020": "new", "sh030": "deferred"}
    assert [s.shot for s in submitter.specs] == ["sh020"]
    spec = submitter.specs[0]
    assert spec.plate == f"{url}/ab/sq010/sh020/plates/bg01/sh020_bg01.####.exr"
    assert (spec.show, spec.sequence, spec.element, spec.frames) == (
        "ab",
        "sq010",
        "bg01",
        "1001-1002",
    )
    assert spec.exr_layout == "single"  # the scan's choice reaches every shot it submits


def test_a_sequence_still_being_written_waits_for_it_to_settle(bucket, tmp_path):
    url, fs, settings = bucket
    _put(fs, url, _shot_keys("sh010", range(1001, 1003)))
    catalog, submitter = open_catalog(f"sqlite:///{tmp_path / 'c.db'}"), FakeSubmitter()
    report = scan([url], catalog, submitter, settings, defaults=ScanDefaults(settle_seconds=600))
    assert [d.action for d in report.sequences] == ["settling"]
    assert "written" in report.sequences[0].reason and submitter.specs == []
    later = scan(
        [url],
        catalog,
        submitter,
        settings,
        defaults=ScanDefaults(settle_seconds=600),
        now=time.time() + 601,
    )
    assert [d.action for d in later.sequences] == ["new"] and len(submitter.specs) == 1


def test_names_that_make_no_valid_shot_are_rejected_with_the_reason(bucket, tmp_path):
    url, fs, settings = bucket
    _put(fs, url, ["ab/sq010/sh 010/plates/bg01/p.1001.exr", "ab/sq010/-x/plates/bg01/p.1001.exr"])
    catalog, submitter = open_catalog(f"sqlite:///{tmp_path / 'c.db'}"), FakeSubmitter()
    report = scan([url], catalog, submitter, settings, defaults=ScanDefaults(settle_seconds=0))
    assert [d.action for d in report.sequences] == ["rejected", "rejected"]
    assert all("not a usable name" in d.reason for d in report.sequences)
    assert submitter.specs == []


def test_an_unreachable_store_is_retried_then_reported(tmp_path):
    settings = Settings(home=tmp_path, s3_endpoint_url="http://127.0.0.1:9")  # nothing listens
    catalog, submitter = open_catalog(f"sqlite:///{tmp_path / 'c.db'}"), FakeSubmitter()
    started = time.monotonic()
    with pytest.raises(ListingError, match="s3://nowhere/plates"):
        list_objects(
            Location(
                "s3://nowhere/plates",
                {
                    "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
                    "key": "k",
                    "secret": "s",
                    "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
                },
            ),
            RetryPolicy(attempts=3, first_wait_s=0.05, deadline_s=5),
        )
    assert time.monotonic() - started < 30
    report = scan(
        ["s3://nowhere/plates"],
        catalog,
        submitter,
        settings,
        defaults=ScanDefaults(listing=RetryPolicy(attempts=2, first_wait_s=0.05, deadline_s=5)),
    )
    assert report.sequences == [] and len(report.errors) == 1
    assert report.errors[0].startswith("s3://nowhere/plates: listing s3://nowhere/plates")

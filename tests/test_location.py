"""`storage.location.Location`: a URI and the fsspec options that reach it, as one value."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import s3fs
from fsspec.implementations.local import LocalFileSystem

from storage.location import Location, StorageOptions, as_location

ENDPOINT = {"client_kwargs": {"endpoint_url": "http://example.invalid:9000"}}


@pytest.fixture
def no_endpoint_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("SVFX_S3_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return monkeypatch


def test_a_location_reads_as_its_uri() -> None:
    where = Location("s3://bucket/shot/out", ENDPOINT)
    assert str(where) == f"{where}" == "s3://bucket/shot/out"
    assert where.is_remote and not Location("/tmp/x").is_remote
    assert not Location("file:///tmp/x").is_remote


def test_the_repr_names_option_keys_never_their_values() -> None:
    where = Location("s3://b/k", {"key": "AKIA", "secret": "hunter2"})
    assert "hunter2" not in repr(where) and "AKIA" not in repr(where)
    assert "key" in repr(where) and "s3://b/k" in repr(where)
    assert repr(Location("/x")) == "Location('/x')"


def test_join_keeps_the_options() -> None:
    root = Location("s3://bucket/out/", ENDPOINT)
    joined = root.join("previews", "/normal/")
    assert joined == Location("s3://bucket/out/previews/normal", ENDPOINT)
    assert Location("/out").join("a") == Location("/out/a")


def test_at_is_another_uri_on_the_same_storage() -> None:
    root = Location("s3://bucket/out", ENDPOINT)
    assert root.at("s3://bucket/out/x.exr") == Location("s3://bucket/out/x.exr", ENDPOINT)
    assert Location("/out").at("/elsewhere/x") == Location("/elsewhere/x")
    assert Location("/out").at("file:///out/x") == Location("file:///out/x")
    with pytest.raises(ValueError, match="not on the same storage"):
        root.at("/local/x.exr")
    with pytest.raises(ValueError, match="not on the same storage"):
        Location("/out").at("s3://bucket/x")


def test_options_are_frozen_and_never_shared_with_the_caller() -> None:
    given = {"client_kwargs": {"endpoint_url": "http://a"}, "anon": False}
    where = Location("s3://b/k", given)
    given["client_kwargs"]["endpoint_url"] = "http://changed"  # the caller's dict
    assert where.fsspec_options()["client_kwargs"]["endpoint_url"] == "http://a"
    handed = where.fsspec_options()
    handed["client_kwargs"]["endpoint_url"] = "http://mutated"  # what fsspec was given
    assert where.fsspec_options()["client_kwargs"]["endpoint_url"] == "http://a"
    assert isinstance(where.options, StorageOptions)
    assert isinstance(where.options["client_kwargs"], StorageOptions)
    with pytest.raises(AttributeError):
        where.options._items = {}  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        where.options["anon"] = True  # type: ignore[index]
    with pytest.raises(AttributeError):
        where.uri = "s3://b/other"  # type: ignore[misc]


def test_equal_locations_hash_alike_and_survive_pickling() -> None:
    one = Location("s3://b/k", {"anon": False, "client_kwargs": {"endpoint_url": "http://a"}})
    two = Location("s3://b/k", {"client_kwargs": {"endpoint_url": "http://a"}, "anon": False})
    assert one == two and hash(one) == hash(two) and len({one, two}) == 1
    assert one != Location("s3://b/k") and one != Location("s3://b/k", {})
    assert Location("s3://b/k") != Location("s3://b/k", {})  # environment vs. none at all
    for where in (one, Location("/local/x"), Location("s3://b/k", {})):
        back = pickle.loads(pickle.dumps(where))
        assert back == where and type(back.options) is type(where.options)
    assert pickle.loads(pickle.dumps(one)).fsspec_options() == one.fsspec_options()


def test_none_takes_the_environment_an_empty_mapping_does_not(
    no_endpoint_env: pytest.MonkeyPatch,
) -> None:
    no_endpoint_env.setenv("SVFX_S3_ENDPOINT_URL", "http://from-env:1")
    assert Location("s3://b/k").fsspec_options() == {
        "client_kwargs": {"endpoint_url": "http://from-env:1"}
    }
    assert Location("s3://b/k", {}).fsspec_options() == {}
    assert Location("s3://b/k", ENDPOINT).fsspec_options() == ENDPOINT
    assert Location("/local/x").fsspec_options() == {}
    no_endpoint_env.delenv("SVFX_S3_ENDPOINT_URL")
    no_endpoint_env.setenv("AWS_ENDPOINT_URL", "http://aws-env:2")
    assert Location("s3://b/k").fsspec_options() == {
        "client_kwargs": {"endpoint_url": "http://aws-env:2"}
    }


def test_the_environment_is_read_when_the_filesystem_is_made(
    no_endpoint_env: pytest.MonkeyPatch,
) -> None:
    where = Location("s3://b/k")
    travelled = pickle.loads(pickle.dumps(where))  # as a worker receives it
    no_endpoint_env.setenv("SVFX_S3_ENDPOINT_URL", "http://worker-env:3")
    fs, path = travelled.fs_and_path()
    assert isinstance(fs, s3fs.S3FileSystem) and path == "b/k"
    assert fs.client_kwargs == {"endpoint_url": "http://worker-env:3"}


def test_or_environment_empties_become_none() -> None:
    assert Location("s3://b/k", {}).or_environment() == Location("s3://b/k")
    assert Location("s3://b/k", ENDPOINT).or_environment() == Location("s3://b/k", ENDPOINT)
    assert Location("/x").or_environment() == Location("/x")


def test_fs_and_path_of_a_local_path(tmp_path: Path) -> None:
    fs, path = Location(str(tmp_path / "a.exr")).fs_and_path()
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "a.exr")


def test_as_location_takes_a_location_or_a_uri_string() -> None:
    where = Location("s3://b/k", ENDPOINT)
    assert as_location(where) is where
    assert as_location("/x") == Location("/x")
    with pytest.raises(TypeError):
        as_location(Path("/x"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Location(Path("/x"))  # type: ignore[arg-type]


def test_the_settings_give_explicit_options(no_endpoint_env: pytest.MonkeyPatch) -> None:
    from schemas.settings import Settings

    with_endpoint = Settings(s3_endpoint_url="http://minio:9000")
    assert with_endpoint.location("s3://b/k") == Location(
        "s3://b/k", {"client_kwargs": {"endpoint_url": "http://minio:9000"}}
    )
    assert with_endpoint.location("/local/x") == Location("/local/x", {})
    no_endpoint_env.setenv("AWS_ENDPOINT_URL", "http://aws-env:2")  # not the settings'
    without = Settings(s3_endpoint_url=None)
    assert without.location("s3://b/k") == Location("s3://b/k", {})
    assert without.location("s3://b/k").fsspec_options() == {}
    assert without.location("s3://b/k").or_environment().fsspec_options() == {
        "client_kwargs": {"endpoint_url": "http://aws-env:2"}
    }

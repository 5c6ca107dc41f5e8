"""What a node reading local disk may go without: imageio-ffmpeg (review clips then use the
`ffmpeg` on PATH, or are skipped with one line), s3fs (the `s3` extra) and psycopg (the
`postgres` extra), each refused by name, with the extra to install, only when asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import SvfxError
from schemas.catalog.engine import make_engine
from storage import review_clip
from storage.location import Location
from tasks.finalize import FinalizeJob, finalize_shot
from tasks.output_paths import ShotOutputPaths

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_ffmpeg(monkeypatch):
    """Neither imageio-ffmpeg importable nor an `ffmpeg` on PATH."""
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.fixture
def without(monkeypatch):
    """Make top-level modules unimportable, as on a node without their extra."""

    def hide(*modules: str) -> None:
        for module in modules:
            monkeypatch.setitem(sys.modules, module, None)

    real = __import__("importlib.util").util.find_spec

    def find_spec(name, *args, **kwargs):
        if sys.modules.get(name, 0) is None:
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr("importlib.util.find_spec", find_spec)
    return hide


def test_without_ffmpeg_review_clips_are_skipped_with_one_line(tmp_path, no_ffmpeg):
    assert review_clip.ffmpeg_exe() is None
    paths = ShotOutputPaths(Location(str(tmp_path / "out")), name="sh010")
    job = FinalizeJob(paths=paths, frames=(1001, 1002), passes=("normal", "seg"),
                      image_size=(64, 32), data_window=(0, 0, 63, 31))  # fmt: skip
    written = finalize_shot(job)
    assert written["review_clips_skipped"] == review_clip.NO_FFMPEG
    assert "\n" not in review_clip.NO_FFMPEG and "ffmpeg" in review_clip.NO_FFMPEG
    assert not any(name.startswith("review_clip_") for name in written)
    asked_none = finalize_shot(FinalizeJob(**{**job.__dict__, "review_clips": False}))
    assert "review_clips_skipped" not in asked_none


def test_without_imageio_ffmpeg_the_ffmpeg_on_path_is_used(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert review_clip.ffmpeg_exe() == str(fake)


def test_a_clip_asked_for_without_ffmpeg_is_refused_by_name(tmp_path, no_ffmpeg):
    with pytest.raises(SvfxError, match="review clips skipped: no ffmpeg here"):
        review_clip.write_review_clip(str(tmp_path / "a.mp4"), [(1, [[0.5]])])


def test_s3_without_its_extra_is_refused_naming_the_extra(without):
    without("s3fs")
    with pytest.raises(SvfxError) as refused:
        Location("s3://bucket/plates/a.####.exr").fs_and_path()
    assert "s3://bucket/plates/a.####.exr: S3 needs s3fs" in refused.value.message
    assert 'pip install "sapiens-vfx[s3]"' in refused.value.message
    Location("/tmp").fs_and_path()  # local disk needs nothing more


def test_postgres_without_its_extra_is_refused_naming_the_extra(without, tmp_path):
    without("psycopg")
    with pytest.raises(SvfxError) as refused:
        make_engine("postgresql://svfx:secret@db:5432/catalog")
    message = refused.value.message
    assert "a PostgreSQL catalog needs psycopg" in message
    assert 'pip install "sapiens-vfx[postgres]"' in message and "secret" not in message
    make_engine(f"sqlite:///{tmp_path / 'catalog.db'}").dispose()


def test_the_cli_refuses_s3_without_the_extra_in_one_line(tmp_path):
    # a child Python where s3fs cannot be imported: `svfx submit` of an s3:// plate
    code = (
        "import sys; sys.modules['s3fs'] = None\n"
        "import importlib.util as u; f = u.find_spec\n"
        "u.find_spec = lambda n, *a, **k: None if n == 's3fs' else f(n, *a, **k)\n"
        "from cli.main import main; sys.argv = ['svfx'] + sys.argv[1:]; main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "submit", "s3://bucket/p/a.####.exr", "--shot", "a/b/c",
         "--frames", "1-2", "--output", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={"SVFX_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SVFX_ALLOWED_ROOTS": f"s3://bucket,{tmp_path}"},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert 'pip install "sapiens-vfx[s3]"' in done.stderr + done.stdout
    assert "Traceback" not in done.stderr

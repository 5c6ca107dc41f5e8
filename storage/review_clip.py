"""An H.264 review clip per pass, with the frame number burnt in, streamed frame by frame.

Frames are piped as raw RGB into ffmpeg, so only one frame is in memory at a time: the binary
`imageio_ffmpeg` ships when it is installed (the tested build, with libx264), else the
`ffmpeg` on PATH. imageio-ffmpeg is imported only here, when a clip is made: a node without
either binary plans and runs shots, and `tasks.finalize` skips their clips with one line
(`ffmpeg_exe` is None). ffmpeg encodes into a local temporary file (MP4 needs to seek back to
write its index), which is then copied to the destination atomically.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from storage.atomic import WriteResult, atomic_upload_file
from storage.errors import StorageError
from storage.exr_writer import to_rational
from storage.location import Where, as_location
from storage.previews import MAX_SIDE, plate_rgb, thumbnail_size

NO_FFMPEG = (
    "review clips skipped: no ffmpeg here (neither imageio-ffmpeg installed nor `ffmpeg` on "
    "PATH); install either to have them"
)


def ffmpeg_exe() -> str | None:
    """The ffmpeg binary clips are encoded with: imageio-ffmpeg's when that package is
    installed, else the `ffmpeg` on PATH; None when there is neither."""
    try:
        import imageio_ffmpeg
    except ImportError:
        return shutil.which("ffmpeg")
    return imageio_ffmpeg.get_ffmpeg_exe()


class ReviewClipWriter:
    """Encode frames into an MP4 at `where`; use as a context manager, then read `result`.

    Every frame is scaled to the clip size (`width` x `height`, rounded down to even numbers
    as yuv420p needs) and gets `label frame` burnt into its lower-left corner. An exception
    inside the block stops ffmpeg and writes nothing.
    """

    def __init__(
        self,
        where: Where,
        width: int,
        height: int,
        fps: float | Fraction = 24,
        *,
        label: str = "",
        crf: int = 18,
    ) -> None:
        self.where = as_location(where)
        self.uri = self.where.uri
        self.width = max(2, width - width % 2)
        self.height = max(2, height - height % 2)
        self.fps = to_rational(fps)
        self.label = label
        self.crf = crf
        self.frames_written = 0
        self.result: WriteResult | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._log: IO[bytes] | None = None
        self._font = ImageFont.load_default(size=max(10, self.height // 18))

    @property
    def _output(self) -> Path:
        assert self._workdir is not None
        return Path(self._workdir.name) / "clip.mp4"

    def __enter__(self) -> ReviewClipWriter:
        exe = ffmpeg_exe()
        if exe is None:
            raise StorageError(f"{self.uri}: {NO_FFMPEG}")
        self._workdir = tempfile.TemporaryDirectory(prefix="svfx-clip-")
        self._log = open(Path(self._workdir.name) / "ffmpeg.log", "w+b")
        command = [
            exe,
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-s",
            f"{self.width}x{self.height}",
            "-framerate",
            f"{self.fps.numerator}/{self.fps.denominator}",
            "-i",
            "-",
            "-an",
            "-c:v",
            "libx264",
            "-preset",
            "medium",
            "-crf",
            str(self.crf),
            "-pix_fmt",
            "yuv420p",
            "-movflags",
            "+faststart",
            str(self._output),
        ]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=self._log)
        return self

    def add_frame(self, image: np.ndarray, frame: int | None = None) -> None:
        """Append one frame (uint8 or [0, 1] float RGB/RGBA, any size) with its number."""
        assert self._process is not None and self._process.stdin is not None, "use as `with`"
        rgb = Image.fromarray(plate_rgb(image))
        if rgb.size != (self.width, self.height):
            rgb = rgb.resize((self.width, self.height), Image.Resampling.LANCZOS)
        if frame is not None or self.label:
            self._burn_in(rgb, f"{self.label} {frame if frame is not None else ''}".strip())
        try:
            self._process.stdin.write(rgb.tobytes())
        except BrokenPipeError as exc:
            raise StorageError(f"{self.uri}: ffmpeg stopped: {self._ffmpeg_log()}") from exc
        self.frames_written += 1

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        assert self._process is not None and self._workdir is not None and self._log is not None
        try:
            if exc_type is not None:
                self._process.kill()
                self._process.wait()
                return
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.close()  # type: ignore[union-attr]
            code = self._process.wait()
            if code != 0 or self.frames_written == 0:
                raise StorageError(
                    f"{self.uri}: ffmpeg failed (exit {code}, {self.frames_written} frames): "
                    f"{self._ffmpeg_log()}"
                )
            self.result = atomic_upload_file(self._output, self.where)
        finally:
            self._log.close()
            self._workdir.cleanup()

    def _burn_in(self, image: Image.Image, text: str) -> None:
        draw = ImageDraw.Draw(image)
        margin = max(2, self.height // 60)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=self._font)
        x, y = margin, self.height - margin - (bottom - top) - 2 * margin
        draw.rectangle(
            [x, y, x + (right - left) + 2 * margin, y + (bottom - top) + 2 * margin], fill=(0, 0, 0)
        )
        draw.text(
            (x + margin - left, y + margin - top), text, fill=(255, 255, 255), font=self._font
        )

    def _ffmpeg_log(self) -> str:
        assert self._log is not None
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace").strip()[-2000:] or "no message"


def write_review_clip(
    where: Where,
    frames: Iterable[tuple[int, np.ndarray]],
    *,
    fps: float | Fraction = 24,
    max_side: int = MAX_SIDE,
    pixel_aspect: float = 1.0,
    label: str = "",
) -> WriteResult:
    """Encode (frame number, image) pairs into an MP4; the clip size comes from the first image."""
    where = as_location(where)
    uri = where.uri
    iterator = iter(frames)
    try:
        first_frame, first_image = next(iterator)
    except StopIteration:
        raise StorageError(f"{uri}: a review clip needs at least one frame") from None
    height, width = np.asarray(first_image).shape[:2]
    clip_w, clip_h = thumbnail_size(width, height, max_side, pixel_aspect)
    writer = ReviewClipWriter(where, clip_w, clip_h, fps, label=label)
    with writer:
        writer.add_frame(first_image, first_frame)
        for frame, image in iterator:
            writer.add_frame(image, frame)
    assert writer.result is not None
    return writer.result


def clip_frame_count(path: str | os.PathLike[str]) -> int:
    """How many frames ffmpeg decodes from a local video file (its stream copied to nowhere:
    the last progress line's count)."""
    exe = ffmpeg_exe()
    if exe is None:
        raise StorageError(f"{path}: {NO_FFMPEG}")
    command = [exe, "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "null", "-"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    counts = re.findall(r"frame=\s*(\d+)", done.stderr)
    if done.returncode != 0 or not counts:
        raise StorageError(f"{path}: ffmpeg could not count its frames: {done.stderr[-500:]}")
    return int(counts[-1])

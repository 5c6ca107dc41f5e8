"""The demo's plate is written once: a second `svfx demo` keeps the frames' files (their mtime
is part of each frame's fingerprint), so it finds every frame done instead of redoing them."""

from __future__ import annotations

import os
from pathlib import Path

from flows.demo import write_demo_plate


def test_a_second_write_keeps_unchanged_frames_and_rewrites_changed_ones(tmp_path: Path):
    write_demo_plate(tmp_path, frames=3, width=32, height=18)
    files = sorted(tmp_path.glob("*.exr"))
    first = {p.name: p.stat().st_mtime_ns for p in files}
    for path in files:  # back-dated: any later write would show as a newer mtime
        stamp = path.stat().st_mtime_ns - 10**9
        os.utime(path, ns=(stamp, stamp))
    kept = {p.name: p.stat().st_mtime_ns for p in files}
    write_demo_plate(tmp_path, frames=3, width=32, height=18)
    assert {p.name: p.stat().st_mtime_ns for p in files} == kept
    assert not list(tmp_path.glob("*.tmp"))
    write_demo_plate(tmp_path, frames=3, width=40, height=18)  # another size: rewritten
    assert all(p.stat().st_mtime_ns > kept[p.name] for p in files)
    assert set(first) == {p.name for p in files}

"""Deleting a version of the demo shot: how long `svfx delete` takes, what it frees, and the
fault check of issue 44: the delete killed (SIGKILL) at random points of its work (after it
has marked the version, while its files go), the catalog compared with the disk right after
each kill (every output either on disk with its recorded size and not marked, or marked
deleted), then the delete run again and checked complete.

    python -m bench.delete [--frames 48] [--size 640x360] [--kills 5] [--seed 1]

It makes the version once with `svfx demo` (every pass, the embedded default) in a scratch
SVFX_HOME, keeps a copy of the version's folder and of the SQLite catalog, and restores both
before each run. Times are wall-clock seconds of the `svfx delete` process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

SVFX = [sys.executable, "-m", "cli"]


def run(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SVFX, *args], env=env, text=True, capture_output=True, **kwargs)


def make_version(home: Path, frames: int, size: str, env: dict[str, str]) -> tuple[str, Path]:
    """The demo shot at ``frames`` frames: its SHOW/SEQ/SHOT and its version folder."""
    started = time.perf_counter()
    made = run(["demo", "--frames", str(frames), "--size", size], env)
    if made.returncode != 0:
        raise SystemExit(f"svfx demo failed ({made.returncode}):\n{made.stderr[-2000:]}")
    print(f"svfx demo --frames {frames} --size {size}: {time.perf_counter() - started:.0f} s")
    with create_engine(f"sqlite:///{home / 'catalog.db'}").connect() as conn:
        root = conn.execute(text("SELECT output_root FROM jobs ORDER BY id DESC")).scalar_one()
    folder = Path(root)
    shot = "/".join(folder.parts[-4:-1])
    return shot, folder


def copy_catalog(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite catalog (its write-ahead log included)."""
    for leftover in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
        leftover.unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def restore(home: Path, folder: Path, saved: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(saved / "version", folder)
    copy_catalog(saved / "catalog.db", home / "catalog.db")


def catalog_against_disk(home: Path) -> tuple[int, int, list[str]]:
    """(outputs on disk, outputs marked deleted, problems): an unmarked output whose file is
    missing or of another size is a problem (a Zarr array's frame: its store must exist)."""
    problems: list[str] = []
    live = marked = 0
    with create_engine(f"sqlite:///{home / 'catalog.db'}").connect() as conn:
        rows = conn.execute(text("SELECT uri, kind, size_bytes, deletion_id FROM outputs"))
        for uri, kind, size, deletion_id in rows:
            if deletion_id is not None:
                marked += 1
                continue
            live += 1
            path = Path(uri)
            whole = path.is_file() and path.stat().st_size == size
            if not (path.exists() if kind == "zarr" else whole):
                problems.append(f"{uri}: in the catalog, not marked deleted, not on disk")
    return live, marked, problems


def timed_delete(shot: str, env: dict[str, str]) -> tuple[float, dict[str, Any] | None]:
    """The delete's wall time and its row (None: the version was deleted already)."""
    started = time.perf_counter()
    done = run(["delete", shot, "--version", "v001", "--json"], env)
    if done.returncode != 0:
        raise SystemExit(f"svfx delete failed ({done.returncode}): {done.stderr.strip()}")
    rows = json.loads(done.stdout) if done.stdout.strip() else []
    return time.perf_counter() - started, (rows[0] if rows else None)


def marked_yet(home: Path) -> bool:
    """Whether the delete has recorded its deletion (its outputs are marked)."""
    with sqlite3.connect(f"file:{home / 'catalog.db'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM deletions").fetchone()[0] > 0


def start_until_marked(
    shot: str, home: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], float]:
    """`svfx delete` started, once it has marked the version (or ended): the process and
    the seconds that took."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*SVFX, "delete", shot, "--version", "v001"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while proc.poll() is None and not marked_yet(home):
        time.sleep(0.005)
    return proc, time.perf_counter() - started


def kill_while_deleting(shot: str, home: Path, env: dict[str, str], after_s: float) -> str:
    """Start `svfx delete`, wait until it has marked the version, let it remove files for
    ``after_s`` more seconds, then SIGKILL it; says how it ended."""
    proc, _marked_s = start_until_marked(shot, home, env)
    time.sleep(after_s)
    if proc.poll() is not None:
        return "had ended"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return "killed"


def killed_runs(shot: str, home: Path, folder: Path, saved: Path, args: argparse.Namespace,
                work_s: float, env: dict[str, str]) -> None:  # fmt: skip
    """``args.kills`` deletes killed at random points of their work (after the version is
    marked, while its files go), each checked, rerun, checked again."""
    rng = random.Random(args.seed)
    for attempt in range(1, args.kills + 1):
        restore(home, folder, saved)
        delay = rng.uniform(0.0, work_s)
        ended = kill_while_deleting(shot, home, env, delay)
        live, marked, problems = catalog_against_disk(home)
        files_left = sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0
        rerun_s, rerun = timed_delete(shot, env)
        live_after, marked_after, after = catalog_against_disk(home)
        verdict = "ok" if not problems and not after and not folder.exists() else "BROKEN"
        print(
            f"kill {attempt}: {delay:.2f} s after marking ({ended}): "
            f"{live} outputs on disk and recorded, {marked} marked deleted, {files_left} files "
            f"left, {len(problems)} outputs recorded but missing; rerun {rerun_s:.2f} s "
            f"({'deleted the rest' if rerun else 'nothing left to do'}) -> "
            f"{live_after} live, {marked_after} marked, folder "
            f"{'gone' if not folder.exists() else 'still there'}: {verdict}"
        )
        for problem in (problems + after)[:5]:
            print("   ", problem)


def time_to_mark(shot: str, home: Path, env: dict[str, str]) -> tuple[float, float]:
    """A whole delete, timed: (seconds until the version was marked, seconds in all)."""
    started = time.perf_counter()
    proc, marked = start_until_marked(shot, home, env)
    proc.wait()
    return marked, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--size", default="640x360")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="svfx-delete-bench-"))
    home = scratch / "home"
    env = {**os.environ, "SVFX_HOME": str(home), "SVFX_ALLOWED_ROOTS": str(scratch)}
    try:
        shot, folder = make_version(home, args.frames, args.size, env)
        saved = scratch / "saved"
        shutil.copytree(folder, saved / "version")
        copy_catalog(home / "catalog.db", saved / "catalog.db")
        full_s, row = timed_delete(shot, env)
        assert row is not None, "the first delete found nothing to delete"
        print(
            f"svfx delete {shot} --version v001: {full_s:.2f} s, {row['files']} files, "
            f"{row['size_bytes'] / 1e6:.1f} MB freed, {row['outputs']} outputs marked deleted"
        )
        restore(home, folder, saved)
        marked_s, whole_s = time_to_mark(shot, home, env)
        work_s = whole_s - marked_s
        print(
            f"of a delete's {whole_s:.2f} s, {marked_s:.2f} s pass before the version is marked "
            f"(the process starting, the catalog read); its files go in the {work_s:.2f} s after"
        )
        killed_runs(shot, home, folder, saved, args, work_s, env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

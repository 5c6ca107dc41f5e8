"""The tiny untrained models (`tasks.checkpoints.untrained`) under submits started together:
built once, by one process, while the others wait, and never rewritten once there
(tests/test_loading.py: the same model saves to the same bytes in any process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tasks.checkpoints.untrained import untrained_checkpoint

REPO = Path(__file__).resolve().parent.parent

# Waits for the go file, so every process asks for the model at the same moment, and counts
# the models it builds.
BUILD = """
import json, os, sys, time
from pathlib import Path
import sapiens.model
from tasks.checkpoints.untrained import untrained_checkpoint
built = []
real_build = sapiens.model.build_model
def counted_build(*args, **kwargs):
    built.append(args)
    return real_build(*args, **kwargs)
sapiens.model.build_model = counted_build
Path(sys.argv[3]).touch()  # ready
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
ref = untrained_checkpoint("tiny", "matting", sys.argv[1])
print(json.dumps({"sha256": ref.sha256, "built": len(built)}))
"""


def test_processes_started_together_build_the_untrained_model_once(tmp_path: Path) -> None:
    folder, go = tmp_path / "untrained", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(folder), str(go), str(tmp_path / f"ready{i}")],
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    while len(list(tmp_path.glob("ready*"))) < len(procs):  # all imported, all waiting
        assert all(proc.poll() is None for proc in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()
    seen = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        seen.append(json.loads(out))
    assert sum(s["built"] for s in seen) == 1
    assert len({s["sha256"] for s in seen}) == 1


def test_an_untrained_model_already_there_is_not_rewritten(tmp_path: Path) -> None:
    first = untrained_checkpoint("tiny", "matting", tmp_path)
    before = os.stat(first.path)
    again = untrained_checkpoint("tiny", "matting", tmp_path)
    after = os.stat(again.path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert again.sha256 == first.sha256

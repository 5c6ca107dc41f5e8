"""A throwaway one-node Slurm cluster of the test's own: slurmctld and slurmd on free loopback
ports, every state, spool, pid and log file in a temporary folder, so the infra/slurm recipe
is tested against a real sbatch/squeue/scancel. Never the machine's own services: the daemons
are started here and stopped by PID (no systemctl); munged is shared by every Slurm on the
machine, so one already running is used and left running, and only one started here is
stopped here.

The measured recipe is stack-notes "Slurm on one machine" (Debian's slurm-wlm 22.05, as root,
no cgroups). Tests skip, saying why, only where the binaries are missing (.ci/run installs
them as root) or where they cannot run (not root: slurmd starts the jobs as their users)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.common import free_port

SLURM_BINARIES = ("slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scancel")
MUNGE_BINARIES = ("munged", "munge", "mungekey")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _missing_binaries() -> list[str]:
    return [name for name in (*SLURM_BINARIES, *MUNGE_BINARIES) if not shutil.which(name)]


def _log_tail(path: Path, chars: int = 2000) -> str:
    try:
        return f"--- {path.name}:\n{path.read_text(errors='replace')[-chars:]}"
    except OSError:
        return f"--- {path.name}: (none)"


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def terminate_all(procs: list[psutil.Process], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL whatever is still there after `timeout`."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


class SlurmServer:
    """One node (this machine, ``hostname -s``) and one default partition; ``start`` waits
    until the node is idle, ``stop`` cancels every job and leaves no process behind."""

    def __init__(self, partition: str = "gpu", max_time: str = "01:00:00") -> None:
        missing = _missing_binaries()
        if missing:
            pytest.skip(
                f"slurm-wlm is not installed: {', '.join(missing)} not found "
                "(apt-get install slurm-wlm munge; .ci/run does it when run as root)"
            )
        if os.geteuid() != 0:
            pytest.skip("a one-node Slurm cluster needs root (slurmd starts jobs as their users)")
        self.partition = partition
        self.max_time = max_time
        self.host = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        # a little under the machine's memory, so slurmd does not drain the node as "low
        # RealMemory"; jobs ask for far less
        self.memory_mb = int(psutil.virtual_memory().total / 2**20 * 0.9)
        self.dir = Path(tempfile.mkdtemp(prefix="svfx-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._munged_pid: int | None = None  # set only when munged was started here

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, squeue, scancel) needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        for name in ("state", "spool"):
            (self.dir / name).mkdir(exist_ok=True)
        d = self.dir
        lines = [
            "ClusterName=svfxtest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # no cgroups in containers and CI: plain process tracking, no task confinement
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=5",  # scancel: SIGKILL 5 s after SIGTERM (default 30)
            "MinJobAge=5",
            "InactiveLimit=0",
            "SlurmdTimeout=60",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} "
            f"RealMemory={self.memory_mb} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.host} Default=YES "
            f"MaxTime={self.max_time} State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    # -- munge ------------------------------------------------------------------------------
    def _munge_answers(self) -> bool:
        try:
            return subprocess.run(["munge", "-n"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munged(self) -> None:
        """Use the machine's munged when one answers; otherwise start one (as the munge
        user, with a key made if there is none) and remember its PID to stop it after."""
        if self._munge_answers():
            return
        try:
            munge = pwd.getpwnam("munge")
        except KeyError:
            raise RuntimeError("munged is not running and there is no munge user") from None
        if not MUNGE_KEY.exists():
            MUNGE_KEY.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            subprocess.run(["mungekey", "-c", "-k", str(MUNGE_KEY)], check=True, timeout=30)
            os.chown(MUNGE_KEY.parent, munge.pw_uid, munge.pw_gid)
            os.chown(MUNGE_KEY, munge.pw_uid, munge.pw_gid)
            MUNGE_KEY.chmod(0o400)
        MUNGE_RUN.mkdir(mode=0o755, exist_ok=True)
        os.chown(MUNGE_RUN, munge.pw_uid, munge.pw_gid)
        done = subprocess.run(
            ["runuser", "-u", "munge", "--", "munged", "--force"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            if self._munge_answers():  # another session started one meanwhile: use it
                return
            raise RuntimeError(f"munged did not start: {done.stderr.strip()}")
        with contextlib.suppress(OSError, ValueError):
            self._munged_pid = int((MUNGE_RUN / "munged.pid").read_text().strip())
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._munge_answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged started but `munge -n` fails after {START_TIMEOUT_S}s")
            time.sleep(0.2)

    # -- slurm ------------------------------------------------------------------------------
    def _spawn(self, name: str) -> None:
        with open(self.dir / f"{name}.out", "ab") as log:
            self._daemons[name] = subprocess.Popen(
                [name, "-D", "-f", str(self.conf)],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our signals to the test never reach the daemons
            )

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (whatever os.environ says)."""
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def node_state(self) -> str:
        done = self.run("sinfo", "-h", "-N", "-n", self.host, "-o", "%T")
        return done.stdout.strip() if done.returncode == 0 else ""

    def job_ids(self) -> list[str]:
        """Every job the cluster still lists (pending, running or completing)."""
        done = self.run("squeue", "-h", "-o", "%i")
        if done.returncode != 0:
            raise RuntimeError(f"squeue failed: {done.stderr.strip()}")
        return done.stdout.split()

    def logs(self) -> str:
        names = ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out")
        return "\n".join(_log_tail(self.dir / name) for name in names)

    def start(self) -> None:
        self.write_conf()
        self._start_munged()
        self._spawn("slurmctld")
        self._spawn("slurmd")
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while state != "idle":
            for name, proc in self._daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"node {self.host} is {state or 'not listed'!r}, not idle, after "
                    f"{START_TIMEOUT_S:.0f}s\n{self.logs()}"
                )
            time.sleep(0.3)
            state = self.node_state()

    def _job_processes(self) -> list[psutil.Process]:
        """Job steps and what they started on this cluster (slurmstepd re-parents them to
        init, so they are found by the SLURM_CONF in their environment)."""
        conf, found = str(self.conf), []
        for proc in psutil.process_iter(["name"]):
            if proc.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error):
                env = proc.environ()
                if env.get("SLURM_CONF") == conf and (
                    "SLURM_JOB_ID" in env or (proc.info["name"] or "").startswith("slurmstepd")
                ):
                    found.append(proc)
        return found

    def stop(self) -> None:
        """Cancel every job (bounded wait for the queue to empty), stop slurmd and
        slurmctld, then anything a job left behind, then munged if it was started here."""
        if self._daemons.get("slurmctld") and self._daemons["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", "--partition", self.partition)
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while self.job_ids() and time.monotonic() < deadline:
                    time.sleep(0.5)
        daemons = []
        for proc in self._daemons.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                daemons.append(psutil.Process(proc.pid))
        terminate_all([*daemons, *self._job_processes()])
        for proc in self._daemons.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if self._munged_pid is not None and _pid_alive(self._munged_pid):
            os.kill(self._munged_pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while _pid_alive(self._munged_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        self._munged_pid = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def slurm_cluster(partition: str = "gpu") -> Iterator[SlurmServer]:
    """A started cluster, with SLURM_CONF set in os.environ meanwhile (dask-jobqueue runs
    sbatch, squeue and scancel with this process's environment), restored after."""
    server = SlurmServer(partition)
    saved = os.environ.get("SLURM_CONF")
    try:
        server.start()
        os.environ.update(server.env)
        yield server
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        server.remove()

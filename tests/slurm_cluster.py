"""A real one-node SLURM cluster for the tests (tests/test_slurm.py): Debian's `slurm-wlm` and `munge`,
installed with apt-get when missing, munged + slurmctld + slurmd started as root with every file
(config, key, sockets, state, logs, pid files) under one folder, and stopped by their pid files,
never by name, so another cluster or test on the machine is left alone.

The ten-odd lines of slurm.conf are what a cluster needs here: no cgroups (proctrack/linuxproc,
task/none), no accounting database (submitit then waits on its result files, not on sacct), one node
with 2 CPUs, private ports. Clients reach it through SLURM_CONF (env()).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmd", "slurmctld", "munged")  # stopped in this order


def installed() -> bool:
    return all(shutil.which(x) for x in ("slurmctld", "slurmd", "sbatch", "scontrol", "munged", "mungekey"))


def install() -> str:
    """apt-get the packages when missing; '' on success, else why not (the tests are then skipped)."""
    if installed():
        return ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "slurm-wlm and munge are not installed, and apt-get cannot install them here (not root)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, close_fds=True)
        if r.returncode != 0:
            return f"{' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return "" if installed() else "apt-get installed slurm-wlm and munge, but their commands are missing"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, home: Path):
        self.home, self.node = home, socket.gethostname().split(".")[0]
        self.conf, self.socket = home / "slurm.conf", home / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}

    def pid_file(self, daemon: str) -> Path:
        return self.home / f"{daemon}.pid"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write(self) -> None:
        for d in ("state", "spool", "munge"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.home / "munge", 0o700)
        h = self.home
        self.conf.write_text(f"""\
ClusterName=deepen
SlurmctldHost={self.node}
SlurmUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.socket}
StateSaveLocation={h}/state
SlurmdSpoolDir={h}/spool
SlurmctldPidFile={self.pid_file('slurmctld')}
SlurmdPidFile={self.pid_file('slurmd')}
SlurmctldLogFile={h}/slurmctld.log
SlurmdLogFile={h}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=30
MinJobAge=600
NodeName={self.node} CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, name: str, cmd: list[str]) -> None:
        """A daemon in the foreground, a child of this process (so it is reaped, never left a zombie),
        in its own session (a Ctrl-C of the tests reaches it only through stop()); close_fds: it holds
        no descriptor of the test process (`heavy`'s slot locks, pytest's pipes)."""
        with open(self.home / f"{name}.out", "ab") as out:
            self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, close_fds=True,
                                                start_new_session=True, env=self.env())
        deadline = time.monotonic() + 60
        while not self.pid_file(name).is_file() and time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited at start: {self.logs()}")
            time.sleep(0.1)

    def start(self, timeout_s: float = 120) -> None:
        self._write()
        key = self.home / "munge" / "munge.key"
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True, close_fds=True)
        os.chmod(key, 0o400)
        m = self.home / "munge"
        self._start("munged", ["munged", "-F", "--force", f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={self.pid_file('munged')}", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed"])
        self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env(),
                               close_fds=True)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM node did not come up: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
                         for f in sorted(self.home.glob("**/*.log")))

    def run(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, env=self.env(), close_fds=True, timeout=60)

    def stop(self, grace_s: float = 30) -> list[str]:
        """Cancel every job (its processes end with it), then SIGTERM each daemon by its pid file,
        SIGKILL after grace_s; -> the daemons still alive (none)."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user=root")
            deadline = time.monotonic() + 2 * grace_s
            while time.monotonic() < deadline and self.run("squeue", "-h", "-o", "%i").stdout.strip():
                time.sleep(0.5)
        left = []
        for daemon in DAEMONS:
            f = self.pid_file(daemon)
            try:
                pid = int(f.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and alive(pid):
                    time.sleep(0.1)
                if not alive(pid):
                    break
            if alive(pid):
                left.append(f"{daemon} ({pid})")
        for proc in self.procs.values():
            if proc.poll() is None:  # one whose pid file was gone or wrong: by its own handle
                proc.kill()
            proc.wait(timeout=grace_s)
        return left

    def pids(self) -> list[int]:
        out = []
        for daemon in DAEMONS:
            try:
                out.append(int(self.pid_file(daemon).read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        return out


def alive(pid: int) -> bool:
    """Running (a zombie, reaped by nobody but init, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

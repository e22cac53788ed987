"""A real Slurm on localhost for tests: Debian's slurmctld + one slurmd per node, all state in a temp dir.

One node is `localhost`. Several nodes (`SlurmCluster(root, nodes=2)`) are `node1`, `node2`, ...: one
slurmd each (`slurmd -N <name>`) on its own port of 127.0.0.1, which Debian's Slurm allows (it is
built with --enable-multiple-slurmd); their spool directories and pid files are per node (`%n`).
Their names do not resolve, as node names on a real cluster need not: a job reaches another node
by its NodeAddr (`scontrol show node`), as slurm/multi_node.sbatch does.

Authentication is `auth/none` + `cred/none` (no munge daemon to manage; Slurm 22.05 has no
`auth/slurm`). Each node claims 8 GPUs and 64 CPUs (`SlurmdParameters=config_overrides`), so the
shipped sbatch scripts' GPU and CPU requests are accepted unchanged on a machine without GPUs; the
jobs themselves train on the CPU. Each fake GPU is a link to /dev/null, because Slurm 22.05 drops a
GPU without a device file. Ports are picked free at start, so clusters of concurrent test runs do
not meet. Client commands find this cluster through `SLURM_CONF`, set in `env()`; nothing under
/etc is read or written. slurmd launches jobs as their user, so the cluster needs root.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "scancel", "squeue")
APT_INSTALL = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
# Job ids: test worker gw<N> draws from its own block of JOB_ID_BLOCK ids, each cluster after the
# last one's (JOB_IDS_PER_CLUSTER apart), starting at a random offset (two suites side by side).
JOB_ID_BLOCK, JOB_IDS_PER_CLUSTER = 2000, 150
_next_job_id: list[int] = []


def next_first_job_id() -> int:
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    start = 1000 + (worker % 4) * JOB_ID_BLOCK
    if not _next_job_id:
        _next_job_id.append(start + random.randrange(0, JOB_ID_BLOCK // 2))
    first = _next_job_id[0]
    _next_job_id[0] = start + (first - start + JOB_IDS_PER_CLUSTER) % (JOB_ID_BLOCK - JOB_IDS_PER_CLUSTER)
    return first


FAKE_GPUS = 8
FAKE_CPUS = 64
# A job finished this long ago is still answered by `scontrol show job` (there is no accounting).
MIN_JOB_AGE_S = 3600


def missing_binaries() -> list[str]:
    return [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def cannot_run_reason() -> str | None:
    """Why a test cluster cannot start here, or None."""
    missing = missing_binaries()
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found); as root: {APT_INSTALL} (.ci/run does it)"
    if os.geteuid() != 0:
        return "the test Slurm runs slurmd, which launches jobs as their user, so it needs root"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _real_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


@dataclass
class Job:
    """One line of `scontrol show job -o`, as a dict of its KEY=VALUE fields."""

    fields: dict[str, str]

    @property
    def state(self) -> str:
        return self.fields["JobState"]

    @property
    def restarts(self) -> int:
        return int(self.fields.get("Restarts", "0"))


# submitit asks `sacct` for job states; without accounting sacct fails, the states stay UNKNOWN and a
# job that died without a result is waited for forever. This stand-in answers from scontrol.
SACCT_STANDIN = """#!{python}
import subprocess, sys
ids = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "-j"]
print("JobID|State|NodeList")
for job_id in ids:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = dict(t.partition("=")[::2] for t in line.split())
        task = f.get("ArrayTaskId", "")
        task = f"[{{task}}]" if "-" in task or "," in task else task  # sacct writes pending ranges so
        name = f"{{f['ArrayJobId']}}_{{task}}" if task else f["JobId"]
        print(f"{{name}}|{{f['JobState']}}|{{f.get('NodeList', '')}}")
"""

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 1):
        self.root = root
        self.conf = root / "slurm.conf"
        self.nodes = ["localhost"] if nodes == 1 else [f"node{i}" for i in range(1, nodes + 1)]
        self.procs: dict[str, subprocess.Popen] = {}  # slurmctld, then "slurmd-<node>" per node

    # --- configuration -------------------------------------------------------------------
    def write_config(self) -> None:
        for sub in ("state", "spool", "log", "run", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        r = self.root
        lines = {
            "ClusterName": "tinytrain-test",
            "SlurmctldHost": "localhost",
            "SlurmctldPort": free_port(),
            "SlurmdPort": free_port(),  # the default; each node below names its own
            # Lightning's MASTER_PORT is 15000 + a job id's last 4 digits, so two clusters must never
            # hand out the same id: not two test workers' at the same time (each worker its own
            # range), nor two clusters one after the other in a worker (a port of the first may linger).
            "FirstJobId": next_first_job_id(),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/none",
            "CredType": "cred/none",
            # A requeued job waits cred_expire before it may start again (default 120 s).
            "AuthInfo": "cred_expire=5",
            "StateSaveLocation": r / "state",
            "SlurmdSpoolDir": r / "spool/%n",
            "SlurmctldPidFile": r / "run/slurmctld.pid",
            "SlurmdPidFile": r / "run/slurmd-%n.pid",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "MpiDefault": "none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            # The main scheduling loop every 2 s (default 60): a requeued job is held cred_expire,
            # then waited for that loop (the hang test's second start came 45 s after the requeue).
            "SchedulerParameters": "bf_interval=1,sched_interval=2",
            "JobRequeue": 1,
            "ReturnToService": 2,
            "KillWait": 5,
            "MinJobAge": MIN_JOB_AGE_S,
            "GresTypes": "gpu",
            # The node claims what the conf says, not what the machine has (fake GPUs and CPUs).
            "SlurmdParameters": "config_overrides",
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        for node in self.nodes:
            # Each node's slurmd listens on its own port, so several share 127.0.0.1.
            text += (
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs={FAKE_CPUS} "
                f"RealMemory={_real_memory_mb()} Gres=gpu:{FAKE_GPUS} State=UNKNOWN\n"
            )
            (self.root / "spool" / node).mkdir()
        text += f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)
        for i in range(FAKE_GPUS):  # shared by the nodes: they are the same machine
            (self.root / "dev" / f"gpu{i}").symlink_to("/dev/null")
        (self.root / "gres.conf").write_text(f"NodeName={','.join(self.nodes)} Name=gpu File={self.root / 'dev'}/gpu[0-{FAKE_GPUS - 1}]\n")

    def env(self, extra: dict | None = None) -> dict:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        env.update(extra or {})
        return env

    # --- daemons -------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        self.write_config()
        # -i: a fresh folder has no saved state to recover, which is not an error.
        self.procs["slurmctld"] = self._spawn([_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for node in self.nodes:
            self.procs[f"slurmd-{node}"] = self._spawn([_binary("slurmd"), "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}")
        deadline = time.monotonic() + timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    # A Slurm built without --enable-multiple-slurmd cannot run a second slurmd here.
                    several = f" ({len(self.nodes)} slurmd on one machine need a Slurm built with --enable-multiple-slurmd, as Debian's is)" if len(self.nodes) > 1 else ""
                    raise RuntimeError(f"{name} exited with status {proc.returncode} while the test cluster started{several}\n{self.logs()}")
            r = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False)
            states = r.stdout.split()
            if r.returncode == 0 and states == ["idle"] * len(self.nodes):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the test cluster's {len(self.nodes)} node(s) did not become idle in {timeout:.0f} s (sinfo says {states})\n{self.logs()}")

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        # In the foreground (-D) with no log file configured, a daemon logs to stderr.
        out = (self.root / "log" / f"{name}.log").open("w")
        # Its own session: signals sent to the test's terminal do not reach it.
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)

    def stop(self, timeout: float = 30) -> None:
        if not self.procs:
            return
        # Jobs first: a slurmd shut down under running steps leaves their slurmstepd behind.
        self.run(["scancel", "--user", pwd.getpwuid(os.getuid()).pw_name], check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
            time.sleep(0.5)
        self.run(["scontrol", "shutdown"], check=False)
        # The slurmds first, then the controller that told them to stop.
        for name in sorted(self.procs, key=lambda name: name == "slurmctld"):
            proc = self.procs[name]
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout)
        self.procs.clear()

    def logs(self, tail: int = 40) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {f.name} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(parts)

    # --- clients -------------------------------------------------------------------------
    def run(self, cmd: list[str], check: bool = True, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run(cmd, env=self.env(env), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stdout}{r.stderr}")
        return r

    def sacct_standin(self, bin_dir: Path) -> Path:
        """Writes `sacct` into bin_dir (put it first on PATH for submitit only)."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        path = bin_dir / "sacct"
        path.write_text(SACCT_STANDIN.format(python=sys.executable))
        path.chmod(0o755)
        return path

    def sbatch(self, script: Path, options: list[str] = (), args: list[str] = (), env: dict | None = None, cwd: Path | None = None) -> int:
        """Submit; returns the job id. `options` go before the script (they override its #SBATCH
        lines), `args` after it (the script passes them on to tinytrain)."""
        cmd = ["sbatch", "--parsable", *options, str(script), *args]
        r = subprocess.run(cmd, env=self.env(env), capture_output=True, text=True, timeout=60, cwd=cwd)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stdout}{r.stderr}")
        return int(r.stdout.strip().split(";")[0])

    def jobs(self, job_id: int | str | None = None) -> list[Job]:
        """`scontrol show job -o [ID]`: every job the controller still knows (MinJobAge), or one
        (an array job's id gives all of its tasks)."""
        out = self.run(["scontrol", "show", "job", "-o", *([str(job_id)] if job_id is not None else [])]).stdout
        return [Job(dict(token.partition("=")[::2] for token in line.split())) for line in out.splitlines() if line.startswith("JobId=")]

    def job(self, job_id: int) -> Job:
        (job,) = self.jobs(job_id)
        return job

    def wait_all(self, timeout: float) -> list[Job]:
        """Waits until no job is pending or running; returns them all."""
        deadline = time.monotonic() + timeout
        while any(job.state not in FINISHED for job in self.jobs()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still running after {timeout:.0f} s: {[(j.fields['JobId'], j.state) for j in self.jobs()]}\n{self.logs()}")
            time.sleep(0.5)
        return self.jobs()

    def wait(self, job_id: int, timeout: float, until=lambda job: job.state in FINISHED) -> Job:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.5)

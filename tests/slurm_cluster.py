"""A one-node SLURM cluster on loopback, for testing sweeps through a real scheduler on one machine.

munged, slurmctld and slurmd run in the foreground as children of this process, each with its own
key, socket, ports, state and spool under one directory (nothing in /etc or /run is touched, so a
system SLURM or munge on the host is left alone). `proctrack/linuxproc` and `task/none`: no
cgroups, so it runs in a container. No root needed: the daemons run as the calling user (SlurmUser,
SlurmdUser), and so do the jobs, which only that user submits.

    python -m tests.slurm_cluster [DIR]   # up until Ctrl-C; prints the `export` lines for sbatch/squeue

Needs Debian's `slurm-wlm` and `munge` (`apt-get install -y slurm-wlm munge`). There is no
accounting database (slurmdbd needs MySQL), so `sacct` would say "accounting storage is disabled";
submitit polls sacct for the state of a job that ends without a result (cancelled, failed), so
`bin/sacct` here answers its one query (`sacct -o JobID,State,NodeList --parsable2 -j ID...`) from
squeue, which remembers finished jobs for MinJobAge seconds.
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REQUIRED = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
PARTITION = "debug"

SACCT = """#!/bin/sh
# sacct stand-in for a cluster without slurmdbd: submitit's state query answered from squeue.
ids=""
while [ $# -gt 0 ]; do
  case "$1" in -j) ids="$ids${ids:+,}$2"; shift 2 ;; *) shift ;; esac
done
echo "JobID|State|NodeList"
[ -n "$ids" ] && exec squeue --noheader --states=all --jobs="$ids" --format='%i|%T|%N'
"""


class SlurmUnavailable(RuntimeError):
    """The cluster cannot be brought up here; the message says why (a test skips with it)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line(host: str) -> str:
    """This host's real CPUs and memory as slurmd sees them (a node configured above them is drained)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise SlurmUnavailable(f"`slurmd -C` printed no NodeName line: {out!r}")
    return f"NodeName={host} NodeAddr=127.0.0.1 " + line.split(" ", 1)[1] + " State=UNKNOWN"


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.procs: dict[str, subprocess.Popen] = {}
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "etc" / "slurm.conf"
        self.startup_s: float | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment for SLURM commands (and for jobs: sbatch exports it) against this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf),
                "PATH": f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

    def cmd(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        proc = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def start(self, timeout: float = 90) -> "LocalSlurm":
        missing = [d for d in REQUIRED if shutil.which(d) is None]
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (apt-get install -y slurm-wlm munge)")
        t0 = time.monotonic()
        for sub in ("etc", "bin", "munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        munge = self.root / "munge"
        key = munge / "munge.key"
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        sock = munge / "munge.socket"
        sacct = self.root / "bin" / "sacct"
        sacct.write_text(SACCT)
        sacct.chmod(0o755)
        user = getpass.getuser()
        log = self.root / "log"
        self.conf.write_text("\n".join([
            "ClusterName=statusbench-local",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            f"SlurmUser={user}", f"SlurmdUser={user}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            f"StateSaveLocation={self.root / 'state'}", f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'state' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'spool' / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}", f"SlurmdLogFile={log / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "MpiDefault=none",
            "ReturnToService=2", "JobRequeue=1", "MailProg=/bin/true",
            # a cancelled or requeued job is killed 2 s after SIGTERM (submitit ignores SIGTERM), not 30
            "KillWait=2", "MinJobAge=600", "SlurmdTimeout=30", "InactiveLimit=0",
            node_line(self.host),
            f"PartitionName={PARTITION} Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            ""]))
        # --force: munged wants its socket reachable by every user; this cluster serves only ours (0700)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                               f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: sock.exists(), timeout, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._wait(lambda: "is UP" in self.cmd("scontrol", "ping", check=False), timeout, "slurmctld ping")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host])
        self._wait(lambda: self.cmd("sinfo", "-h", "-n", self.host, "-o", "%t", check=False).strip() == "idle",
                   timeout, "node idle")
        self.startup_s = time.monotonic() - t0
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)  # a Ctrl-C reaches us, not the daemons

    def _wait(self, ready, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    self.stop()
                    raise SlurmUnavailable(f"{name} exited {proc.returncode} waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        self.stop()
        raise SlurmUnavailable(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.logs()}")

    def logs(self, tail: int = 15) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job (their slurmstepd outlive slurmd), then end the daemons this object started."""
        if "slurmd" in self.procs and self.procs["slurmd"].poll() is None:
            self.cmd("scancel", f"--user={getpass.getuser()}", check=False)
            end = time.monotonic() + 30
            while time.monotonic() < end and self.cmd("squeue", "-h", "-o", "%i", check=False).strip():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str]) -> int:
    import tempfile

    root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="statusbench-slurm-"))
    cluster = LocalSlurm(root)
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        print(f"slurm_cluster: cannot start: {exc}", file=sys.stderr)
        return 1
    print(f"SLURM up in {cluster.startup_s:.1f}s (partition {PARTITION}); in another shell:\n"
          f"  export SLURM_CONF={cluster.conf} PATH={root / 'bin'}:$PATH\nCtrl-C stops it.", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

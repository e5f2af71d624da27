"""A cluster on one machine: rabit-run across hosts made of network namespaces.

    sudo "$(command -v python)" scripts/cluster_demo.py
        [--hosts 3] [--slots 2] [--ranks 4] [--rounds 8] [--bench]
        [--scenario all|clean|kill-rank|kill-twice|kill-host|freeze-host|stop-rank|hang-rank]
        [--json out.json]

(``sudo "$(command -v python)"`` runs the virtualenv's Python as root; a bare
``sudo python`` would run the system's, without rabit_py.)

Each host is a network namespace with its own address, hostname, temporary
folder (``TMPDIR``) and ``/dev/shm`` (shared/notes/multihost.md has the recipe and what it showed);
Open MPI reaches the hosts through an rsh agent that enters a host's
namespace with a clean environment, as ssh would. The job is
``tests/programs/bsp_train.py`` (a BSP loop with global and local models,
checkpointed every round) with the shared-memory path on for every size
(``RABIT_SHM_MIN_BYTES=1``), so the groups of Note [fixed groups] are used.

Scenarios, each compared bitwise with a failure-free run on this machine
alone (no namespaces):

- ``clean``: failure-free across the hosts;
- ``kill-rank``: one rank SIGKILLed from outside; recovered in the job (the
  replacement may start on another host);
- ``kill-twice``: rank 3 killed, then rank 2 once the job went on: the
  second repair across hosts can hang in Open MPI's spawn
  (open-mpi/ompi#12599, #12601); the repair deadline (RABIT_RECOVERY_TIMEOUT,
  8 s here) or the collective timeout then ends the attempt, and rabit-run
  restarts it from the durable checkpoint;
- ``kill-host``: every process of the second host (ranks fill the hosts'
  slots in order, so it holds ranks) SIGKILLed and its network cut;
  rabit-run restarts from the durable checkpoint on the hosts that remain
  (``--max-restarts``, ``--checkpoint-dir`` on a folder every host sees), so
  the hosts must have slots enough without it (3 hosts of 2 slots, 4 ranks);
- ``freeze-host``: the second host's network cut and its processes stopped;
  the job must not hang: the collective timeout ends the attempt, and the
  restart leaves the host out;
- ``stop-rank``: the last rank (on the second host) stopped with SIGSTOP;
  its heartbeats stop, and rabit-run ends it through the launch agent (rule
  (e) of Note [supervision]): replaced in the job;
- ``hang-rank``: the last rank's first process hangs in its own code
  (``bsp_train.py --hang``); at the collective timeout (5 s here) the
  waiting ranks ask rabit-run to end it (Note [hung ranks]), which it does
  through the launch agent: replaced in the job.

``--bench`` times an allreduce across the hosts instead, side by side: MPI
with HAN off (what rabit-run uses on several hosts), MPI with HAN on (the
layout-dependent choice), and rabit_py's shared-memory path per host with
MPI between hosts (Note [fixed groups]); it prints a table with the ratios.

Needs root (``ip netns``). Everything it makes (namespaces, a bridge,
``/etc/netns/<host>``, folders) is removed at the end, however it ends.
Timings share this machine's cores between all hosts: say so next to them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = [sys.executable, str(ROOT / "tests" / "programs" / "bsp_train.py")]


def can_make_hosts() -> Tuple[bool, str]:
    """Whether namespace hosts can be made here, and why not."""
    if os.geteuid() != 0:
        return False, "needs root (ip netns)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return False, f"needs {tool}"
    probe = f"rabitprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


class Made:
    """Something made on entry (``_up``) and removed on exit (``down``), also
    when making it fails half-way."""

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError


class Hosts(Made):
    """``count`` namespace hosts on a bridge (a context manager: made on
    entry, removed on exit).

    Args:
        count: hosts to make.
        slots: MPI slots per host (the hostfile's ``slots=``).
    """

    def __init__(self, count: int, slots: int = 2) -> None:
        tag = f"rp{os.getpid() % 100000}"
        self.names = [f"{tag}h{i}" for i in range(1, count + 1)]
        self.slots = slots
        self.bridge = f"{tag}br"
        self._veths = [f"{tag}v{i}" for i in range(1, count + 1)]
        self._net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        # Not under /tmp or /dev/shm, which each host replaces with its own.
        self.base = Path(tempfile.mkdtemp(prefix="rabit-hosts-", dir="/var/tmp"))
        self.shared = self.base / "shared"        # a folder every host sees
        self.agent = self.base / "agent"
        self.hostfile = self.base / "hostfile"
        self._made: List[str] = []

    # ------------------------------------------------------------ making
    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def _up(self) -> None:
        self.sweep_stale()
        # Who made these hosts: a later run removes them if this process dies
        # before down() (SIGKILL, a machine restart), see sweep_stale.
        from rabit_py.launcher._processes import start_time
        (self.base / "owner.json").write_text(json.dumps({
            "pid": os.getpid(), "started": start_time(os.getpid()), "names": self.names,
            "veths": self._veths, "bridge": self.bridge}))
        self.shared.mkdir()
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._made.append("bridge")
        self._ip("link", "set", self.bridge, "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{self._net}.{i} {name}\n" for i, name in enumerate(self.names, 1))
        for i, (name, veth) in enumerate(zip(self.names, self._veths), 1):
            self._ip("netns", "add", name)
            self._made.append(name)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            self._ip("link", "set", f"{veth}p", "netns", name)
            self._ip("-n", name, "link", "set", f"{veth}p", "name", "eth0")
            self._ip("-n", name, "addr", "add", f"{self._net}.{i}/24", "dev", "eth0")
            self._ip("-n", name, "link", "set", "eth0", "up")
            self._ip("-n", name, "link", "set", "lo", "up")
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            etc = Path("/etc/netns") / name
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            for folder in ("tmp", "shm"):
                (self.base / name / folder).mkdir(parents=True)
                os.chmod(self.base / name / folder, 0o1777)
        # The rsh agent: PRRTE calls `agent HOST command...`. Like sshd, it
        # gives the command a clean environment.
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        # Each host's temporary folder is its own TMPDIR (where Open MPI
        # keeps its session files), not a mount over /tmp: the job's program,
        # interpreter or checkout may live under /tmp (a CI virtualenv did).
        # A host whose network is cut does not answer, as ssh would not.
        self.agent.write_text(
            "#!/bin/sh\n"
            'host="$1"; shift\n'
            'ip -n "$host" link show eth0 2>/dev/null | grep -q LOWER_UP || '
            '{ echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255; }\n'
            f'exec ip netns exec "$host" unshare --uts --mount sh -c \'hostname "$0"; '
            f'mount --bind {self.base}/"$0"/shm /dev/shm; exec env -i HOME=/root '
            f'PATH={path} TMPDIR={self.base}/"$0"/tmp sh -c "$1"\' "$host" "$*"\n')
        self.agent.chmod(0o755)
        self.hostfile.write_text("".join(f"{n} slots={self.slots}\n" for n in self.names))

    def down(self) -> None:
        """Remove everything made (kills what still runs in the hosts)."""
        for name in self.names:
            if name in self._made:
                self.signal_host(name, signal.SIGCONT)
                self.signal_host(name, signal.SIGKILL)
        for name in self.names:
            if name in self._made:
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        for veth in self._veths:
            # Deleting a namespace frees its end of the pair only once the
            # kernel lets the namespace go (seconds later): delete ours now.
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        if "bridge" in self._made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self._made.clear()
        for _ in range(10):
            shutil.rmtree(self.base, ignore_errors=True)
            if not self.base.exists():
                break
            time.sleep(0.2)

    @classmethod
    def sweep_stale(cls) -> None:
        """Remove the hosts of earlier runs whose process died before taking
        them down (their ``owner.json`` names a process that is gone)."""
        from rabit_py.launcher._processes import start_time
        for owner in Path("/var/tmp").glob("rabit-hosts-*/owner.json"):
            try:
                made = json.loads(owner.read_text())
            except (OSError, ValueError):
                continue
            if made.get("started") and start_time(made["pid"]) == made["started"]:
                continue                    # its maker still runs
            stale = cls.__new__(cls)
            stale.names, stale._veths, stale.bridge = made["names"], made["veths"], made["bridge"]
            stale.base = owner.parent
            stale._made = [*made["names"], "bridge"]
            stale.down()

    # ------------------------------------------------------------ using
    def address(self, host: str) -> str:
        """``host``'s address (reachable only inside the hosts)."""
        return f"{self._net}.{self.names.index(host) + 1}"

    def pids(self, host: str) -> List[int]:
        """The processes running in ``host``'s network namespace."""
        out = subprocess.run(["ip", "netns", "pids", host], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def signal_host(self, host: str, signum: int) -> List[int]:
        """Send ``signum`` to every process of ``host``; returns their PIDs."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return pids

    def cut(self, host: str) -> None:
        """Cut ``host`` off the network (its link down)."""
        subprocess.run(["ip", "link", "set", self._veths[self.names.index(host)], "down"],
                       capture_output=True)

    def command(self, argv: Sequence[str], host: Optional[str] = None) -> List[str]:
        """``argv`` run inside ``host`` (default: the first), with the
        caller's environment (as a user's shell on a login node)."""
        host = host or self.names[0]
        script = (f'hostname "$0"; mount --bind {self.base}/"$0"/shm /dev/shm; '
                  f'TMPDIR={self.base}/"$0"/tmp exec "$@"')
        return ["ip", "netns", "exec", host, "unshare", "--uts", "--mount", "sh", "-c",
                script, host, *argv]

    def rabit_run(self, ranks: int, program: Sequence[str], *options: str) -> List[str]:
        """The rabit-run command of a job across the hosts."""
        return self.command([sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks),
                             "--hostfile", str(self.hostfile),
                             "--mca", "plm_rsh_agent", str(self.agent),
                             "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
                             *options, "--", *program])


# ---------------------------------------------------------------- scenarios
def _results(out: str) -> Dict[int, dict]:
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            results[r["rank"]] = r
    return results


def _start(cmd: List[str], env: Dict[str, str]) -> "subprocess.Popen[str]":
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, **env})


def _finish(proc: "subprocess.Popen[str]", lines: List[str], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        lines.append(f"cluster_demo: cut after {timeout:g} s\n")
        return -9


def _reader(proc: "subprocess.Popen[str]", lines: List[str],
            on_line: Optional[Callable[[str], None]] = None) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


JOB_ENV = {"RABIT_ENGINE": "robust", "RABIT_SHM_MIN_BYTES": "1", "RABIT_TIMEOUT": "30"}


def xgboost_program(rounds: int) -> List[str]:
    """Real XGBoost through rabit_py.xgboost (tests/programs/xgboost_train.py),
    slow enough per round that a kill lands inside training; its RESULT
    lines carry the booster's sha256."""
    return [sys.executable, str(ROOT / "tests" / "programs" / "xgboost_train.py"),
            "--rounds", str(rounds), "--rows", "8000", "--sleep", "0.3", "--timeout", "20"]


def reference(ranks: int, rounds: int,
              program: Optional[Sequence[str]] = None) -> Tuple[Dict[int, dict], float]:
    """The failure-free run on this machine alone: of ``program`` (default:
    bsp_train.py for ``rounds`` rounds); its RESULT lines by rank, and its
    seconds."""
    if program is None:
        program = [*PROGRAM, "--rounds", str(rounds), "--sleep", "0.5"]  # as the scenarios
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks), "--", *program]
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, **JOB_ENV})
    if out.returncode != 0:
        raise RuntimeError(f"the reference run failed:\n{out.stdout}{out.stderr}")
    return _results(out.stdout), time.monotonic() - start


def run_scenario(hosts: Hosts, name: str, ranks: int, rounds: int,
                 timeout: float = 300, program: Optional[Sequence[str]] = None,
                 cue: str = "ROUND 2 done") -> dict:
    """Run one scenario; returns its record (status, seconds, results, output).

    ``program`` (default: bsp_train.py for ``rounds`` rounds) prints ``START``
    and ``RESULT`` lines as bsp_train.py does; the failure comes at the first
    output line that starts with ``cue``."""
    options: List[str] = []
    env = dict(JOB_ENV)
    program = (list(program) if program is not None
               else [*PROGRAM, "--rounds", str(rounds), "--sleep", "0.5"])
    last = hosts.names[1]
    if name in ("kill-host", "kill-rank", "kill-twice", "freeze-host", "stop-rank",
                "hang-rank"):
        options = ["--max-restarts", "2", "--restart-delay", "0.5",
                   "--checkpoint-dir", str(hosts.shared / "ckpt")]
    if name == "freeze-host":
        env["RABIT_TIMEOUT"] = "10"
    if name == "kill-twice":
        env["RABIT_RECOVERY_TIMEOUT"] = "8"
    if name == "hang-rank":
        env["RABIT_TIMEOUT"] = "5"
        program += ["--hang", f"{ranks - 1},2"]
    lines: List[str] = []
    pids: Dict[int, int] = {}
    done = threading.Event()
    second = threading.Event()

    def on_line(line: str) -> None:
        if line.startswith("START "):
            start = json.loads(line[6:])
            pids[start["rank"]] = start["pid"]
        if name == "kill-twice" and line.startswith("ROUND 4 done") and done.is_set() \
                and not second.is_set():
            second.set()
            victim = pids.get(ranks - 2)
            if victim is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                lines.append(f"cluster_demo: killed rank {ranks - 2} (pid {victim})\n")
        if line.startswith(cue) and not done.is_set():
            done.set()
            if name in ("kill-rank", "kill-twice"):
                victim = pids.get(ranks - 1)
                if victim is not None:
                    # The rank's PID as its host sees it: signal every process
                    # of that PID in the host (PID namespaces are not split).
                    os.kill(victim, signal.SIGKILL)
                    lines.append(f"cluster_demo: killed rank {ranks - 1} (pid {victim})\n")
            elif name == "kill-host":
                hosts.signal_host(last, signal.SIGKILL)
                hosts.cut(last)
                lines.append(f"cluster_demo: killed host {last}\n")
            elif name == "freeze-host":
                hosts.cut(last)
                hosts.signal_host(last, signal.SIGSTOP)
                lines.append(f"cluster_demo: froze host {last}\n")
            elif name == "stop-rank":
                victim = pids.get(ranks - 1)
                if victim is not None:
                    os.kill(victim, signal.SIGSTOP)
                    lines.append(f"cluster_demo: stopped rank {ranks - 1} (pid {victim})\n")

    cmd = hosts.rabit_run(ranks, program, *options)
    start = time.monotonic()
    proc = _start(cmd, env)
    reader = _reader(proc, lines, on_line)
    code = _finish(proc, lines, timeout)
    reader.join(timeout=10)
    seconds = time.monotonic() - start
    if name == "freeze-host":
        hosts.signal_host(last, signal.SIGCONT)
    return {"scenario": name, "status": code, "seconds": seconds,
            "results": _results("".join(lines)), "output": "".join(lines)}


BENCH_PROGRAM = """
import json, sys, time
import numpy as np
import rabit_py as r
r.init()
out = {}
for n in (1 << 10, 1 << 17, 1 << 21):
    x = np.ones(n)
    for _ in range(3):
        r.allreduce(x, r.Op.SUM)
    times = []
    for _ in range(int(sys.argv[1])):
        start = time.perf_counter()
        r.allreduce(x, r.Op.SUM)
        times.append(time.perf_counter() - start)
    out[n * 8] = sorted(times)[len(times) // 2]
if r.get_rank() == 0:
    print("BENCH " + json.dumps(out), flush=True)
r.finalize()
"""

# (name, rabit-run options, environment): how a SUM crosses the hosts.
BENCH_VARIANTS = [
    ("MPI, HAN off (rabit-run's default on several hosts)", [], {}),
    ("MPI, HAN on (bits depend on the layout)", ["--mca", "coll", "^hcoll"], {}),
    ("rabit_py shared memory per host + MPI (fixed groups)", [], {"RABIT_SHM_MIN_BYTES": "1"}),
]


def bench(hosts: Hosts, ranks: int, reps: int = 30) -> List[dict]:
    """Median allreduce times across the hosts for each variant, side by side."""
    rows = []
    for name, options, env in BENCH_VARIANTS:
        cmd = hosts.rabit_run(ranks, [sys.executable, "-c", BENCH_PROGRAM, str(reps)], *options)
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "RABIT_ENGINE": "robust", **env})
        line = next((x for x in out.stdout.splitlines() if x.startswith("BENCH ")), None)
        if line is None:
            raise RuntimeError(f"{name}: no result\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        rows.append({"variant": name, "median_s": {int(k): v for k, v in
                                                   json.loads(line[6:]).items()}})
    return rows


def print_bench(rows: List[dict]) -> None:
    sizes = sorted(rows[0]["median_s"])
    print("| variant | " + " | ".join(f"{s >> 10} KiB" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    base = rows[0]["median_s"]
    for row in rows:
        cells = [f"{row['median_s'][s] * 1e3:.2f} ms ({row['median_s'][s] / base[s]:.2f}x)"
                 for s in sizes]
        print(f"| {row['variant']} | " + " | ".join(cells) + " |")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--scenario", default="all",
                        choices=["all", "clean", "kill-rank", "kill-twice", "kill-host",
                                 "freeze-host", "stop-rank", "hang-rank"])
    parser.add_argument("--bench", action="store_true",
                        help="time allreduce across the hosts: HAN off (the default), HAN on, "
                             "rabit_py's shared-memory groups; print a table and write --json")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    ok, why = can_make_hosts()
    if not ok:
        print(f"cluster_demo: cannot make namespace hosts here: {why}", file=sys.stderr)
        return 2
    if args.bench:
        with Hosts(args.hosts, args.slots) as hosts:
            rows = bench(hosts, args.ranks)
        print(f"cluster_demo: allreduce (SUM, float64), median of 30, {args.ranks} ranks on "
              f"{-(-args.ranks // args.slots)} namespace hosts sharing this machine's "
              f"{os.cpu_count()} cores (ratio to HAN off)")
        print_bench(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    ranks = args.ranks
    ref, ref_seconds = reference(ranks, args.rounds)
    print(f"cluster_demo: reference on this machine alone: {ref_seconds:.1f} s")
    names = (["clean", "kill-rank", "kill-twice", "kill-host", "freeze-host", "stop-rank",
              "hang-rank"]
             if args.scenario == "all"
             else [args.scenario])
    records = []
    failed = 0
    for name in names:
        with Hosts(args.hosts, args.slots) as hosts:
            record = run_scenario(hosts, name, ranks, args.rounds)
        same = record["results"] and all(
            (r["model"], r["local"], r["version"])
            == (ref[k]["model"], ref[k]["local"], ref[k]["version"])
            for k, r in record["results"].items()) and sorted(record["results"]) == sorted(ref)
        good = record["status"] == 0 and same
        failed += not good
        print(f"cluster_demo: {name}: {'ok' if good else 'FAILED'} in {record['seconds']:.1f} s "
              f"(status {record['status']}, results {'identical' if same else 'differ'})")
        if not good:
            print(record["output"][-4000:])
        records.append({k: v for k, v in record.items() if k != "results"})
    if args.json:
        Path(args.json).write_text(json.dumps({"reference_seconds": ref_seconds,
                                               "records": records}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

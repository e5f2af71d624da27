"""Benchmark: the training loop of bench_bandwidth.py across two hosts on a shaped link.

    python scripts/bench_hosts.py [--rates 10gbit,1gbit] [--per-host 1]
                                  [--sizes 64K,1M,16M] [--batches 5]
                                  [--json out.json] [--plot out.png]      (as root)

What predicts a cluster: two namespace hosts (``cluster_demo.Hosts``, made
and removed by the script) whose links are shaped with ``tc`` (a token bucket
on each host's interface: every byte a host sends passes it) to a real
network's rate. For each rate, two jobs under rabit-run run the loop of
``bench_bandwidth.py`` (two in-place float32 SUM allreduces per iteration,
plus ``lazy_checkpoint`` for rabit_py; contenders alternate batch by batch):

- as rabit-run starts a job on several hosts: Open MPI's HAN off (``--mca
  coll ^han``, Note [several hosts] in the launcher): raw mpi4py, the
  default path (robust engine, check on), the same with ``prepare_fun``;
- with HAN left on (``--mca coll ^monitoring``, which keeps every component
  rabit-run would drop): raw mpi4py only, to show what turning HAN off costs.

The table gives the time per iteration and each contender's speed against
raw of the same job (raw time / ours, per batch), median and range.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_bandwidth  # noqa: E402
from cluster_demo import Hosts  # noqa: E402

from rabit_py.extras import require  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BURST = {"10gbit": "4mb", "1gbit": "512kb"}


def shape(hosts: Hosts, rate: str) -> None:
    """A token bucket of ``rate`` on each host's interface (what it sends)."""
    for name in hosts.names:
        subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "replace", "dev", "eth0",
                        "root", "tbf", "rate", rate, "burst", BURST.get(rate, "1mb"),
                        "latency", "50ms"], check=True, capture_output=True, text=True)


def job(hosts: Hosts, ranks: int, sizes: str, batches: int, contenders: str,
        mca_coll: Optional[str]) -> dict:
    """One job of bench_bandwidth's worker across the hosts; its RESULT."""
    program = [sys.executable, str(ROOT / "scripts" / "bench_bandwidth.py"), "--worker",
               "--ranks-now", str(ranks), "--sizes", sizes, "--batches", str(batches),
               "--contenders", contenders]
    options = ["--mca", "coll", mca_coll] if mca_coll else []
    cmd = hosts.rabit_run(ranks, program, *options)
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=3600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "RABIT_TIMEOUT": "300"})
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the job failed ({out.returncode}):\n{out.stdout[-3000:]}"
                           f"{out.stderr[-3000:]}")
    return json.loads(lines[0][7:])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10gbit,1gbit")
    parser.add_argument("--per-host", type=int, default=1, help="ranks per host")
    parser.add_argument("--sizes", default="64K,1M,16M")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_hosts.py makes network namespaces: run it as root", file=sys.stderr)
        return 2
    if args.plot:
        require("matplotlib", "bench", "--plot")
    ranks = 2 * args.per_host
    figures: Dict[str, dict] = {}
    with Hosts(2, slots=args.per_host) as hosts:
        for rate in args.rates.split(","):
            shape(hosts, rate)
            print(f"  {rate}: HAN off (rabit-run's default)", file=sys.stderr, flush=True)
            off = job(hosts, ranks, args.sizes, args.batches, "raw,rabit,rabit+prepare", None)
            print(f"  {rate}: HAN on", file=sys.stderr, flush=True)
            on = job(hosts, ranks, args.sizes, args.batches, "raw", "^monitoring")
            # raw with HAN on, as a contender of the HAN-off job's table
            for size, samples in off["results"].items():
                samples["raw, HAN on"] = on["results"][size]["raw"]
            figures[f"{rate}"] = off
    title = (f"Two namespace hosts, {args.per_host} rank(s) each, link shaped by tc (tbf); "
             f"{os.cpu_count()} cores; HAN off as rabit-run sets it on several hosts, "
             f"'raw, HAN on' from a second job")
    print("\n" + bench_bandwidth.report(figures, title, args.batches))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    if args.plot:
        bench_bandwidth.plot(figures, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

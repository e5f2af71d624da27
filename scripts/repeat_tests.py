"""Run test files again and again beside CPU hogs: how often does each pass?

    python scripts/repeat_tests.py [--runs 20] [--hogs 2] [--json out.json]
                                   tests/jobs/test_supervision.py tests/jobs/test_hosts.py ...

Each run starts one ``python -m pytest -q`` per file, in turn, while ``--hogs``
CPU-bound loops run beside it (a loaded node: scheduling delays are where
races show). It prints a line per run and file (passed, failed, the failed
tests' names), then a table of passes per file, and writes JSON with every
run (a failed run's whole output goes to a text file beside it). A flaky
test is a failed test: the point of the script is the count. The hogs are
this script's own children and are ended at the end, however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]


def run_file(path: str, timeout: float) -> Dict[str, object]:
    """One pytest run of ``path``: its status, time and failed tests."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-rf", path], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = 124, f"timed out after {timeout:g} s\n{exc.stdout or ''}"
    failed = sorted(set(re.findall(r"^FAILED (\S+)", out, re.MULTILINE)))
    summary = (re.findall(r"^=* ?(\d+ (?:passed|failed).*?) in [\d.]+s", out, re.MULTILINE)
               or [out.strip().splitlines()[-1] if out.strip() else ""])[-1]
    return {"file": path, "code": code, "seconds": round(time.monotonic() - start, 1),
            "failed": failed, "summary": summary, "tail": out[-3000:] if code else "",
            "output": out if code else ""}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="test files to run")
    parser.add_argument("--runs", type=int, default=20, help="runs of every file")
    parser.add_argument("--hogs", type=int, default=2, help="CPU-bound loops beside the tests")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds one file's run may take (then it counts as failed)")
    parser.add_argument("--json", default="bench-results/repeat_tests.json",
                        help="where to write every run")
    args = parser.parse_args(argv)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hogs)]
    runs: List[Dict[str, object]] = []
    try:
        for index in range(args.runs):
            for path in args.files:
                result = run_file(path, args.timeout)
                result["run"] = index
                if result["output"]:
                    # A failure's whole output (pytest's report of every failed
                    # test), beside the JSON: the tail alone shows the last one.
                    name = (os.path.splitext(args.json)[0]
                            + f"-run{index + 1}-{os.path.basename(path)}.txt")
                    os.makedirs(os.path.dirname(os.path.abspath(name)), exist_ok=True)
                    with open(name, "w") as fh:
                        fh.write(str(result["output"]))
                    result["output"] = name
                runs.append(result)
                verdict = "ok" if result["code"] == 0 else f"FAILED (status {result['code']})"
                print(f"run {index + 1}/{args.runs} {path}: {verdict}, {result['summary']}, "
                      f"{result['seconds']} s"
                      + "".join(f"\n    {name}" for name in result["failed"]), flush=True)
                os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
                with open(args.json, "w") as fh:
                    json.dump({"hogs": args.hogs, "runs": runs}, fh, indent=1)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"\n| file | passed | runs | hogs |\n|---|---|---|---|")
    for path in args.files:
        mine = [r for r in runs if r["file"] == path]
        print(f"| {path} | {sum(r['code'] == 0 for r in mine)} | {len(mine)} | {args.hogs} |")
    print(f"wrote {args.json}")
    return 0 if all(r["code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The restart policy of ``rabit-run``: each attempt under supervision, and
after a failure that a restart may cure, the next one (``--max-restarts``,
``--restart-delay``), without the hosts that were lost."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional

from ._command import Launch
from ._hosts import leave_out_lost_hosts
from ._supervisor import LAUNCH_FAILED, Attempt, Outcome

__all__ = ["run_with_restarts", "MAX_WAIT_S"]

_LAUNCH_TRIES = 3
MAX_WAIT_S = 30.0       # the longest wait before a restart


def _run(launch: Launch, env: Dict[str, str]) -> Outcome:
    """Run one attempt under supervision (Note [supervision] in ``_supervisor.py``).

    An mpirun that fails to start the job at all (PRRTE's exit status 213, no
    rank started: "The PMIx server's listener thread failed to start", an
    intermittent PMIx fault) is started again, up to twice; it is
    not a failure of the job, and restarts are not spent on it.
    """
    for tries in range(_LAUNCH_TRIES):
        outcome = Attempt(launch.cmd, launch.ranks, env, launch.stall_timeout,
                          launch.private_dirs, launch.status_parent, launch.forward_env,
                          launch.quiet_banners, one_host=launch.hosts is None).run()
        if (outcome.code != LAUNCH_FAILED or outcome.interrupted or outcome.started
                or tries == _LAUNCH_TRIES - 1):
            return outcome
        print(f"rabit-run: mpirun could not start the job (exit status {outcome.code}, no "
              f"rank started); starting it again", file=sys.stderr, flush=True)
        time.sleep(0.5)
    raise AssertionError("unreachable")



def run_with_restarts(launch: Launch, max_restarts: int, delay: float,
                       env: Dict[str, str]) -> int:
    """Run the job; start it again after a failure that a restart may cure,
    up to ``max_restarts`` times (without the hosts that were lost, Note
    [several hosts]); print a summary of what happened."""
    start = time.monotonic()
    failed_time = 0.0
    attempt = 0
    recoveries = replaced = 0
    ended: List[str] = []               # ranks ended alone: stopped or hung (rules (e), (f))
    streak = 0          # failed attempts in a row that made no progress
    reasons: List[str] = []
    folder: Optional[str] = None        # the hostfiles without the lost hosts
    try:
        while True:
            began = time.monotonic()
            outcome = _run(launch, {**env, **launch.env, "RABIT_RESTART_COUNT": str(attempt)})
            recoveries += outcome.recoveries
            replaced += outcome.replaced
            ended += outcome.ended
            code = outcome.code
            if outcome.interrupted:
                name = {2: "Ctrl-C", 15: "SIGTERM"}.get(code - 128, f"signal {code - 128}")
                print(f"rabit-run: stopped by {name}: the job and every process it started "
                      f"have ended", file=sys.stderr, flush=True)
                break
            if code == 0:
                break
            failed_time += time.monotonic() - began
            reasons.append(outcome.why)
            if not outcome.restartable:
                print(f"rabit-run: the job cannot start: {outcome.why}; not restarting it (a "
                      f"restart would fail the same way)" if outcome.setup else
                      f"rabit-run: the program aborted the job: {outcome.why}; not "
                      f"restarting it" if outcome.aborted else
                      f"rabit-run: the job failed: {outcome.why}. A bug in the program, which "
                      f"a restart would repeat: not restarting it", file=sys.stderr,
                      flush=True)
                break
            if attempt >= max_restarts:
                if max_restarts:
                    print(f"rabit-run: the job failed ({outcome.why}) and {max_restarts} "
                          f"restart(s) are used up; giving up", file=sys.stderr, flush=True)
                break
            if launch.hosts:
                folder = folder or tempfile.mkdtemp(prefix="rabit-run-hosts-")
                cannot = leave_out_lost_hosts(launch, folder)
                if cannot is not None:
                    print(f"rabit-run: the job failed ({outcome.why}); {cannot}; not "
                          f"restarting it", file=sys.stderr, flush=True)
                    break
            attempt += 1
            # An attempt that got further than it started resumes from a newer
            # checkpoint: a failure again is a new fault, not a broken set-up,
            # so the back-off starts over.
            streak = 0 if outcome.progressed else streak + 1
            wait = min(delay * 2 ** max(streak - 1, 0), MAX_WAIT_S)
            print(f"rabit-run: the job failed ({outcome.why}); restart {attempt} of "
                  f"{max_restarts} in {wait:g} s", file=sys.stderr, flush=True)
            time.sleep(wait)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    if attempt or recoveries:
        why = "".join(f"\n  restart {i + 1}: {r}" for i, r in enumerate(reasons[:attempt]))
        why += "".join(f"\n  {e}" for e in ended)
        print(f"rabit-run: {_count(attempt + 1, 'attempt', 'attempts')}, "
              f"{time.monotonic() - start:.1f} s in all, {failed_time:.1f} s in failed "
              f"attempts; {_count(recoveries, 'in-job recovery', 'in-job recoveries')} "
              f"({_count(replaced, 'process', 'processes')} replaced); exit status {code}{why}",
              file=sys.stderr, flush=True)
    return code


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"

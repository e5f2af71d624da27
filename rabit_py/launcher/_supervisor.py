"""Supervising one attempt of a job started by ``rabit-run``.

# Note [supervision]
``rabit-run`` starts ``mpirun`` in a session of its own, gives the job a
status folder (Note [status folder] in ``_status.py``), and watches it. It
ends the whole job -- every process it started, found through ``/proc`` since
ranks run in process groups of their own -- when:

(a) a process reports that the job cannot go on (a ``fatal`` mark: a recovery
    that is impossible or stuck, a timeout, an uncaught exception), and the
    job has not ended by itself within ``FATAL_GRACE_S`` (an ``MPI_Abort``
    under ULFM does not always end the job: it can run on for minutes,
    printing ``LAUNCHER JOB OBJECT NOT FOUND``);
(b) no rank made progress for the stall timeout while every living rank was
    inside rabit_py (a collective or a repair), none in the program's own
    code: a wedge (survivors looping in ``NBC_Progress: an error 75``, a
    replacement blocked for good in ``PMIx_Get``). The default timeout is
    ``STALL_FACTOR`` times the longest gap between two progress reports seen
    so far, within [``STALL_FLOOR_S``, ``STALL_CEILING_S``]. A rank whose
    process is stopped (SIGSTOP) computes nothing, whatever its last
    heartbeat says: it does not hold the others' wait for program code;
(c) the ranks have all ended but mpirun has not (after recoveries Open MPI
    sometimes stays: processes stuck joining, or a teardown hang);
(d) a rank died while the others were spawning processes for other ranks,
    and the spawn has not ended ``SPAWN_DEATH_S`` later (Note [stuck spawn]).

And it ends one rank, not the job, when

(e) that rank's process (on this host) has been stopped (SIGSTOP: a paused
    VM's or container's process, a job-control stop) for ``FROZEN_S`` while
    another rank waits inside rabit_py: a frozen rank holds everyone, and
    killed it is a dead rank, which the job replaces in place (bitwise, no
    restart). A process that a debugger holds (tracing stop) is left alone.
    On another host, where rabit-run cannot read a process's state, a rank
    whose heartbeats stopped for ``SILENT_S`` while a rank that still beats
    waits inside rabit_py is ended the same way, through the launch agent
    that PRRTE reaches that host with (``plm_rsh_agent``, ssh by default;
    ``Attempt.end_process``). The watchdog thread beats every second
    whatever the program computes, so silence means a stopped process, one
    where Python no longer runs (a C call holding the interpreter's lock for
    that long would be taken for one), or a host that does not answer. If
    the agent cannot reach the host (here or in rule (f)), rabit-run says
    so and ends the attempt at once instead of waiting for the collective
    timeout: the restart leaves that host out (Note [several hosts] in
    ``_command.py``). The ranks of a lost host cannot be replaced in the job:
    Open MPI 5.0's PRRTE ends a job whose daemon it loses (PRRTE gained
    tolerance of lost daemons after it: openpmix/prrte#2443).
    A replacement that freezes again and again is ended each time until the
    engine's crash-loop rule (``RABIT_CRASH_LOOP``) ends the job as a bug;
(f) a rank waited in a collective past the collective timeout and asked for
    the ranks that hold it to be ended (Note [hung ranks] in
    ``engine/_watchdog.py``): each rank of this host that is in its own code
    and behind that call (its last call comes before it, or it runs that
    call's ``prepare_fun``) is killed, and the
    job replaces it in place as in (e). A request is acted on once, and only
    while fresh (``OVERDUE_FRESH_S``); a rank on another host is ended
    through the launch agent, as in (e);
(g) a parameter server's process (``rabit-run --servers``) has been stopped
    for ``FROZEN_S`` (this host), or its heartbeats stopped for ``SILENT_S``
    (another host: a thread of the server beats every second, whatever its
    loop does; it is ended through the launch agent as in (e)): it holds
    every worker that pulls from it, and killed it is a dead server, whose
    replica takes its place (or whose death ends the job for a restart from
    the shard checkpoints: Note [server replicas] in ``kvstore/server.py``).

# Note [stuck spawn]
``MPI_Comm_spawn`` and the merge after it are not fault tolerant in Open MPI
5: when a process taking part dies during them, the survivors wait for good
(no repair output, then ``NBC_Progress: an error 75`` loops).
The engine's RABIT_RECOVERY_TIMEOUT ends such a repair, but only after its
30 s. The survivors wait for new processes asleep, outside MPI, and a death
then is recovered in the job (Note [quiet spawn] in
``engine/recovery/_join.py``); from the moment they are all inside MPI with
the newcomers (the accept on the port, the merge) they report the spawn in
their heartbeat (state ``spawn`` and the ranks that repair replaces, by
spawned processes or by spares), so
rabit-run can tell that case exactly: a rank whose process is gone and which
is not among those being replaced died during the spawn (or just before it,
which wedges it as well). A rank that a spare takes over in the same repair
died before the shrink and takes no part in the spawn: it is among those
being replaced, not a death during the spawn. The condition must
hold ``SPAWN_DEATH_S`` (heartbeats lag up to a second behind a spawn that
ended) before rabit-run ends the job for a restart.

# Note [teardown hang]
After in-job recoveries that spawned processes, Open MPI 5's MPI_Finalize
sometimes never returns in processes of the original launch, the spawned
ones gone: the main thread waits in ``ompi_mpi_finalize`` -> ``usleep``, the
lazy wait for the PMIx fence that opens MPI_Finalize, for good. Open MPI's issues: the fence waiting on failed processes
(open-mpi/ompi#9434, closed as fixed in 2022) and parents of spawned
processes hanging in finalize (open-mpi/ompi#13127, open). Open MPI 5.0.11 has no
switch to skip that fence (``ompi_async_mpi_finalize`` is not a setting).
The job's work is done: every rank finalized and wrote its exit report, which
rabit_py does just before MPI_Finalize. Rule (c) ends such a job after
``EXIT_GRACE_S`` (``SPAWNED_EXIT_GRACE_S`` once a process replaced a dead
rank or server: then the hang is common) with exit status 0, and says which processes were left and
whether they had ended rabit_py (then the hang is MPI's) or not (a process of
ours that did not end, e.g. a spare never released: that is a bug of ours).

A job is given private folders for what Open MPI leaves on the node (its
session directory, the shared-memory backing files), and they are removed
when the attempt ends, however it ends (clean exit, abort, stall, Ctrl-C).

Progress is a change in any rank's reported position (version, call number,
call kind); a rank is alive while its process exists (same host) or its
heartbeat keeps changing (another host).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

from ._command import agent_name, launch_agent
from ._output import BannerFilter, pump
from ._processes import descendants, forwarded, is_stopped, kill_tree, start_time
from .._status import (ABORT, BUG, SETUP, STATUS_DIR_VARIABLE, Report, job_done,
                       process_alive, read_reports)

__all__ = ["Attempt", "Outcome", "descendants", "kill_tree", "forwarded", "STATUS_DIR_VARIABLE"]

SIGNAL_GRACE_S = 10.0     # after Ctrl-C: time for mpirun to end the job itself
FATAL_GRACE_S = 3.0       # after a fatal report: time for the job to end itself
EXIT_GRACE_S = 10.0       # every rank finalized: time for the processes to exit
# The same after processes were spawned into the job (Note [teardown hang]):
# a clean MPI_Finalize takes well under a second here, and after a spawn it
# hangs often (most recovery tests met it), so the job is not kept 10 s.
SPAWNED_EXIT_GRACE_S = 3.0
LINGER_S = 5.0            # no process left but mpirun: time for it to exit
DEAD_RANKS_S = 1.0        # every rank dead, other processes left: time before ending them
BEAT_STALE_S = 10.0       # a heartbeat unchanged this long: that rank is gone
SPAWN_DEATH_S = 2.0       # Note [stuck spawn]: a death during a spawn, this long
FROZEN_S = 2.0            # rule (e): a rank stopped this long while others wait: killed
OVERDUE_FRESH_S = 5.0     # rule (f): a rank's request to end the ranks it waits for, this new
SILENT_S = 5.0            # rule (e): a rank on another host without heartbeats this long: ended
REMOTE_KILL_S = 20.0      # the launch agent's time to end a process on another host
AGENT_FAILED = 255        # ssh's status when it cannot reach the host (the command's own else)
STALL_FACTOR = 10.0
STALL_FLOOR_S = 60.0
STALL_CEILING_S = 900.0
LAUNCH_FAILED = 213       # PRRTE: the job could not be started
COMPUTING = ("user", "prepare", "done")     # states outside rabit_py's waits
REPLACED_IN_PLACE = "so that the job replaces it in place"


@dataclasses.dataclass
class Outcome:
    """How one attempt ended."""

    code: int                        # the exit status to report
    interrupted: bool = False        # the user stopped it (Ctrl-C, SIGTERM)
    why: str = ""                    # why it failed, for the summary ("" = it did not)
    restartable: bool = True         # whether a restart may help
    setup: bool = False              # the job could not start as set up (not restartable)
    aborted: bool = False            # the program ended the job on purpose (not restartable)
    started: bool = False            # whether any rank started
    recoveries: int = 0              # in-job recoveries the ranks reported
    replaced: int = 0                # processes that replaced a dead rank in the job
    #: rules (e) and (f): the ranks ended alone, as "frozen: ..." / "hung: ..."
    ended: List[str] = dataclasses.field(default_factory=list)
    progressed: bool = False         # whether the ranks got further than they started


class Attempt:
    """One run of the job's mpirun under supervision (Note [supervision]).

    Args:
        cmd: the mpirun command line.
        ranks: the job's number of ranks (spares not counted).
        env: the environment for mpirun.
        stall_timeout: seconds without progress that make a wedge; None: the
            default derived from the progress seen (see the note).
        private_dirs: give Open MPI private session and shared-memory folders
            (one node only: the folders exist on this host).
        status_parent: where to make the status folder (default: the
            system's temporary folder).
        forward_env: add ``-x NAME`` to the mpirun command for each ``RABIT_*``
            variable (and ``PYTHONPATH``), the status folder's included.
        quiet_banners: leave Open MPI's banners that repeat what rabit_py
            says out of the job's stderr (Note [quiet banners] in _output.py).
        one_host: the job runs on this host only: a job whose ranks all
            ended before rabit_py started is a set-up error (on several
            hosts it may be a host that could not be reached).
    """

    def __init__(self, cmd: List[str], ranks: int, env: Dict[str, str],
                 stall_timeout: Optional[float] = None, private_dirs: bool = True,
                 status_parent: Optional[str] = None, forward_env: bool = False,
                 quiet_banners: bool = True, one_host: bool = True) -> None:
        self.cmd, self.ranks = cmd, ranks
        self.quiet_banners = quiet_banners
        self.one_host = one_host
        self.stall_timeout = stall_timeout
        self.status_dir = tempfile.mkdtemp(prefix="rabit-run-", dir=status_parent)
        self.env = {**env, STATUS_DIR_VARIABLE: self.status_dir}
        if forward_env:
            self.cmd = forwarded(cmd, self.env)
        self._made: List[str] = [self.status_dir]
        if private_dirs:
            session = tempfile.mkdtemp(prefix="rabit-run-ompi-")
            self.env["PRTE_MCA_prte_tmpdir_base"] = session
            self._made.append(session)
            if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
                shm = tempfile.mkdtemp(prefix="rabit-run-", dir="/dev/shm")
                self._made.append(shm)
                for name in ("btl_sm_backing_directory", "osc_sm_backing_directory"):
                    self.env.setdefault(f"OMPI_MCA_{name}", shm)
        self._host = socket.gethostname()
        #: (host, who): a host that the launch agent could not reach to end
        #: that rank or server ("rank 3", "server 1"; Note [supervision],
        #: rules (e), (f) and (g)).
        self.unreachable: Optional[Tuple[str, str]] = None
        #: rules (e), (f): the ranks ended alone ("frozen: ..." / "hung: ..."),
        #: appended by the supervision and the threads that end remote ones
        self.ended: List[str] = []
        self._pids_seen: Set[int] = set()
        # Every process of the job seen while mpirun lived, with its start
        # time: one that mpirun left behind (reparented to init when mpirun
        # exited, so no longer its descendant) is ended too: a spare of a
        # job that a rank's bug ended, say.
        self._tree: Dict[int, str] = {}
        self._said: Set[str] = set()

    # ------------------------------------------------------------ running
    def run(self) -> Outcome:
        """Run the attempt to its end; every process it started has ended and
        its folders are removed when this returns."""
        self._began = time.time()
        # Notes [whole lines] and [quiet banners] in _output.py; a stream
        # that takes no bytes (a test's capture) is left to mpirun.
        out_sink = getattr(sys.stdout, "buffer", None)
        err_sink = getattr(sys.stderr, "buffer", None)
        proc = subprocess.Popen(self.cmd, start_new_session=True, env=self.env,
                                stdout=subprocess.PIPE if out_sink is not None else None,
                                stderr=subprocess.PIPE if err_sink is not None else None)
        lock = threading.Lock()
        pumps = ([pump(proc.stdout, out_sink, lock)] if out_sink is not None else []) + (
            [pump(proc.stderr, err_sink, lock,
                  BannerFilter() if self.quiet_banners else None)]
            if err_sink is not None else [])
        try:
            return self._supervise(proc)
        finally:
            self._pids_seen.update(kill_tree(proc.pid))
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self._end_left_behind()
            for thread in pumps:
                thread.join(timeout=5)      # the job's last words, before the verdict
            self._clean_up()

    def remember(self, pids: List[int]) -> None:
        """Note processes of the job (see ``_tree``)."""
        for pid in pids:
            if pid not in self._tree:
                started = start_time(pid)
                if started is not None:
                    self._tree[pid] = started

    def _end_left_behind(self) -> None:
        """SIGKILL the job's processes that outlived mpirun (the same
        processes: same PID and start time)."""
        for pid, started in self._tree.items():
            if start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self._pids_seen.add(pid)
                except (ProcessLookupError, PermissionError):
                    pass

    def _supervise(self, proc: "subprocess.Popen[bytes]") -> Outcome:
        received: List[int] = []

        def forward(signum: int, frame: object) -> None:
            received.append(signum)
            if len(received) == 1:
                try:   # mpirun forwards the signal to the ranks and ends the job
                    os.killpg(proc.pid, signum)
                except ProcessLookupError:
                    pass
            else:
                self._pids_seen.update(kill_tree(proc.pid))

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        watch = _Watch(self)
        stopped: Optional[str] = None        # why we ended the job, if we did
        signal_deadline: Optional[float] = None
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if received:
                    signal_deadline = signal_deadline or now + SIGNAL_GRACE_S
                    if now > signal_deadline:
                        self._pids_seen.update(kill_tree(proc.pid))
                    continue
                if stopped is None:
                    stopped = watch.look(now, proc.pid)
                    if stopped is not None:
                        self._say(f"rabit-run: {stopped}; stopping the job")
                        self._pids_seen.update(kill_tree(proc.pid))
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        reports = read_reports(self.status_dir)
        outcome = self._judge(code, reports, watch, stopped)
        outcome.interrupted = bool(received)
        if received:
            outcome.code = 128 + received[0]
        return outcome

    def _judge(self, code: int, reports: Dict[str, Report], watch: "_Watch",
               stopped: Optional[str]) -> Outcome:
        code = code if code >= 0 else 128 - code
        ranks = {n: r for n, r in reports.items() if n.startswith("rank-")}
        watch.count(ranks)      # the last beats, written at exit
        clean = sum(1 for r in ranks.values() if r.ok and r.failed is None)
        fatal = {n: r for n, r in reports.items() if r.fatal}
        failed = any(r.failed is not None for r in ranks.values())
        # Note [several hosts] in _command.py: ranks on hosts that cannot see
        # the status folder report nothing; the ranks that can see it say
        # whether every rank finalized (job.done).
        everyone = clean >= self.ranks or (job_done(self.status_dir) and not failed)
        outcome = Outcome(code, started=any(r.started for r in ranks.values()),
                          recoveries=watch.recoveries, replaced=watch.replaced,
                          progressed=watch.longest_gap > 0, ended=list(self.ended))
        all_clean = everyone and not fatal
        if all_clean and (code == 0 or code > 128 or stopped is not None):
            if code > 128 and stopped is None:
                # Under --with-ft ulfm a process that replaced a dead rank
                # can finalize cleanly, then abort inside Open MPI's own
                # teardown (ompi_dpm_dyn_finalize: "free(): invalid next
                # size"). The job's work is complete.
                self._say(f"rabit-run: every rank finalized cleanly, then a process died "
                          f"of signal {code - 128} in MPI's own teardown (an Open MPI bug "
                          f"seen after recoveries); the job's work is complete: exit "
                          f"status 0")
            outcome.code = 0
            return outcome
        if fatal:
            # The earliest report is the cause; later ones are its consequences
            # (a peer that a bug's abort killed, a recovery it made impossible).
            _, first = min(fatal.items(), key=lambda item: (item[1].fatal_at, item[0]))
            category, reason = first.fatal           # type: ignore[misc]
            outcome.restartable = category not in (BUG, SETUP, ABORT)
            outcome.setup = category == SETUP
            outcome.aborted = category == ABORT
            outcome.why = reason
        elif stopped is not None:
            outcome.why = stopped
        elif (self.one_host and not outcome.started and 0 < code < 128
              and code != LAUNCH_FAILED):
            # No rank got as far as rabit_py: a missing file, an import error,
            # a bad setting -- what a restart would repeat.
            outcome.restartable, outcome.setup = False, True
            outcome.why = (f"the program ended with exit status {code} before any rank "
                           f"started rabit_py (its error is above)")
        if stopped is not None:
            outcome.code = 1            # we ended it: mpirun's own status says nothing
        unfinished = sorted(int(n.split("-", 1)[1]) for n, r in ranks.items()
                            if r.started and not r.ok)
        if outcome.code == 0 and (unfinished or stopped or fatal):
            if unfinished and not fatal and stopped is None:
                # Under --with-ft ulfm mpirun can exit 0 with every rank SIGKILLed.
                self._say(f"rabit-run: mpirun reported success but rank(s) "
                          f"{', '.join(map(str, unfinished))} ended without finalize "
                          f"(killed?); the job failed")
            outcome.code = 1
        if not outcome.why and outcome.code != 0:
            outcome.why = f"exit status {outcome.code}"
        return outcome

    def _say(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            print(text, file=sys.stderr, flush=True)

    def end_process(self, label: str, who: str, pid: int, host: str, why: str,
                    then: str = REPLACED_IN_PLACE) -> bool:
        """SIGKILL the process ``pid`` on ``host`` of ``who`` (``"rank 3"``,
        ``"server 1"``), which ``why`` (``"was stopped ..."``) explains and
        ``then`` (what the job does about it) follows: on this host at once,
        on another through the launch agent that PRRTE uses to reach it, in
        the background (a host that does not answer must not hold the
        supervision). What was done is said and kept for the summary under
        ``label``; a host the agent cannot reach is kept in
        :attr:`unreachable`. Returns False if the process was gone already
        (this host)."""
        if host == self._host:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
            self._ended(label, f"{who} (pid {pid}) {why}; killed it, {then}")
            return True
        agent = launch_agent(self.cmd, self.env)
        threading.Thread(target=self._end_remote,
                         args=(agent, label, who, pid, host, why, then), daemon=True).start()
        return True

    def _end_remote(self, agent: List[str], label: str, who: str, pid: int, host: str,
                    why: str, then: str) -> None:
        try:
            done = subprocess.run([*agent, host, f"kill -KILL {pid}"], env=self.env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=REMOTE_KILL_S, start_new_session=True)
            failed = (f"exit status {done.returncode}: {done.stderr.strip()[-300:]}"
                      if done.returncode else None)
            if done.returncode not in (0, AGENT_FAILED):
                return          # kill itself failed: the process had ended meanwhile
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed = str(exc)
        what = f"{who} (pid {pid} on host {host}) {why}"
        if failed is None:
            self._ended(label, f"{what}; killed it there through the launch agent "
                               f"({agent_name(agent)}), {then}")
            return
        self._say(f"rabit-run: {what}; the launch agent ({' '.join(agent)}) could not reach "
                  f"the host to end it: {failed}")
        self.unreachable = self.unreachable or (host, who)     # read by _Watch.look

    def _ended(self, label: str, what: str) -> None:
        self.ended.append(f"{label}: {what}")
        self._say(f"rabit-run: {what}")

    def _clean_up(self) -> None:
        """Remove the attempt's folders, and segments of rabit_py's own
        shared-memory path left by processes killed while making one."""
        for pid in self._pids_seen:
            for path in glob.glob(f"/dev/shm/rabit_py-{pid}-*"):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if self._made[1:]:         # private folders: one node
            self._sweep_open_mpi_segments()
        for folder in self._made:
            for _ in range(10):
                # A process that is still dying (or Open MPI removing its own
                # session files at the same time) can make one pass fail.
                shutil.rmtree(folder, ignore_errors=True)
                if not os.path.exists(folder):
                    break
                time.sleep(0.2)


    def _sweep_open_mpi_segments(self) -> None:
        """Open MPI shared-memory segments that the attempt's processes left
        in /dev/shm despite the private folder (``sm_segment.<host>...`` of a
        process of the job, made during the attempt): this user's, made since the attempt began, mapped by no
        process. Another job's live segment is always mapped by its owner."""
        if not os.path.isdir("/dev/shm"):
            return
        uid = os.getuid()
        found = []
        for path in glob.glob(f"/dev/shm/sm_segment.{self._host}.*"):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_uid == uid and st.st_mtime >= self._began - 1:
                found.append(path)
        if not found:
            return
        mapped = _mapped_files()
        for path in found:
            if path not in mapped:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _mapped_files() -> Set[str]:
    """Every file that some process maps (Linux /proc)."""
    mapped: Set[str] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    if "/dev/shm/" in line:
                        mapped.add(line.split(None, 5)[-1].strip().replace(" (deleted)", ""))
        except OSError:
            continue
    return mapped


class _Watch:
    """What the supervisor learns from the status folder, look after look."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.next_look = 0.0
        self.fatal_since: Optional[float] = None
        self.positions: Dict[str, Tuple[int, int, int]] = {}
        self.beats: Dict[str, Tuple[int, float]] = {}     # name -> (beat, when it changed)
        self.progress_at: Optional[float] = None
        self.longest_gap = 0.0
        self.finalized_since: Optional[float] = None
        self.alone_since: Optional[float] = None
        self.spawn_death_since: Optional[float] = None
        self.seen_processes = False
        self.recoveries = 0
        self.replaced = 0
        self.frozen_since: Dict[int, float] = {}     # rule (e): pid -> stopped since
        self.servers_frozen_since: Dict[int, float] = {}     # rule (g), the same
        #: each server's first process, and whether one was replaced by a
        #: spawned process (Note [teardown hang])
        self.server_pids: Dict[str, int] = {}
        self.server_spawned = False
        self.overdue_seen: Set[Tuple[str, float]] = set()   # rule (f): the requests acted on
        self.hung_killed: Set[int] = set()          # rule (f): the processes killed
        self.silenced: Set[Tuple[str, int]] = set()  # rule (e), other hosts: (name, last beat)

    def count(self, ranks: Dict[str, Report]) -> None:
        """Take the in-job recovery counters (and PIDs) from the ranks' beats."""
        for report in ranks.values():
            if report.beat is not None:
                self.attempt._pids_seen.add(report.beat[5])
                self.recoveries = max(self.recoveries, report.beat[7])
                self.replaced = max(self.replaced, report.beat[8])

    def stall_timeout(self) -> float:
        if self.attempt.stall_timeout is not None:
            return self.attempt.stall_timeout
        return min(STALL_CEILING_S, max(STALL_FLOOR_S, STALL_FACTOR * self.longest_gap))

    def look(self, now: float, mpirun: int) -> Optional[str]:
        """One look at the job; returns why to stop it, or None."""
        if now < self.next_look:
            return None
        self.next_look = now + 0.5
        reports = read_reports(self.attempt.status_dir)
        ranks = {n: r for n, r in reports.items() if n.startswith("rank-")}
        self.count(ranks)
        # (a) a process reported that the job cannot go on (the verdict
        # names the cause once the attempt is over).
        if any(r.fatal for r in reports.values()):
            self.fatal_since = self.fatal_since or now
            if now - self.fatal_since > FATAL_GRACE_S:
                return (f"the job reported that it cannot go on and did not end within "
                        f"{FATAL_GRACE_S:g} s")
            return None
        processes = descendants(mpirun)
        self.attempt.remember(processes)
        # (c) every rank finalized, but the processes do not exit.
        clean = sum(1 for r in ranks.values() if r.ok and r.failed is None)
        if clean >= self.attempt.ranks:
            self.finalized_since = self.finalized_since or now
            grace = SPAWNED_EXIT_GRACE_S if self.replaced or self.server_spawned else \
                EXIT_GRACE_S
            if now - self.finalized_since > grace:
                return teardown_message(reports, processes, grace)
        else:
            self.finalized_since = None
        alive = {n: r for n, r in ranks.items() if self._alive(n, r, now)}
        if processes:
            self.seen_processes = True
        exiting = any(r.ok for r in ranks.values())     # rule (c) above covers those
        if self.seen_processes and (not processes or (ranks and not alive and not exiting)):
            self.alone_since = self.alone_since or now
            # Ranks known dead (their processes are gone) leave nothing to wait for.
            linger = LINGER_S if not processes else DEAD_RANKS_S
            if now - self.alone_since > linger:
                return ("every rank has ended but mpirun has not" if not processes else
                        "no rank of the job is alive, but processes of it remain (stuck "
                        "joining or exiting)")
        else:
            self.alone_since = None
        # (d) Note [stuck spawn].
        stuck = self._stuck_spawn(ranks, alive)
        if stuck is None:
            self.spawn_death_since = None
        else:
            self.spawn_death_since = self.spawn_death_since or now
            if now - self.spawn_death_since > SPAWN_DEATH_S:
                return stuck
        # (e) a rank stopped while the others wait for it: end it alone.
        self._end_frozen(now, alive)
        self._end_frozen_servers(now, reports)
        if self.attempt.unreachable is not None:
            host, who = self.attempt.unreachable
            return (f"host {host} does not answer: {who} there held the others and the "
                    f"launch agent could not reach the host to end it")
        # (f) a rank that the others waited for past the collective timeout.
        self._end_hung(alive)
        # (b) a stall: no progress while every living rank waits inside rabit_py.
        positions = {n: r.position for n, r in ranks.items() if r.position is not None}
        if positions != self.positions:
            if self.progress_at is not None and self.positions:
                self.longest_gap = max(self.longest_gap, now - self.progress_at)
            self.positions, self.progress_at = positions, now
            return None
        if self.progress_at is None or not alive:
            return None
        if any(r.state in COMPUTING and not self._frozen(r) for r in alive.values()):
            self.progress_at = now          # the program computes: not our wedge
            return None
        stalled = now - self.progress_at
        if stalled > self.stall_timeout():
            return (f"no rank made progress for {stalled:.0f} s while all waited inside "
                    f"rabit_py (a wedge; --stall-timeout {self.stall_timeout():g} s)")
        return None

    def _frozen(self, report: Report) -> bool:
        """Whether the rank's process (on this host) is stopped: its last
        heartbeat may say ``user`` (a rank stopped at the start of a call
        before its heartbeat thread ran again), but it
        computes nothing, so the others waiting for it are a wedge."""
        beat = report.beat
        return beat is not None and beat[6] == self.attempt._host and is_stopped(beat[5])

    def _end_frozen(self, now: float, alive: Dict[str, Report]) -> None:
        """Rule (e) of Note [supervision]: SIGKILL a rank's process that has
        been stopped for ``FROZEN_S`` while another rank waits inside
        rabit_py; the job then replaces it as a dead rank."""
        stopped = {}
        for name, report in alive.items():
            # The rank's newest process (a rank that stops before its first
            # heartbeat has only its start record).
            where = report.started_by or (report.beat[5:7] if report.beat else None)
            if where is not None and where[1] == self.attempt._host and is_stopped(
                    where[0], traced=False):
                stopped[where[0]] = name
        for pid in list(self.frozen_since):
            if pid not in stopped:
                del self.frozen_since[pid]          # continued (or gone)
        waiting = any(r.state not in COMPUTING for n, r in alive.items()
                      if n not in stopped.values())
        for pid, name in stopped.items():
            since = self.frozen_since.setdefault(pid, now)
            if not waiting or now - since < FROZEN_S:
                continue
            if self.attempt.end_process(
                    "frozen", name.replace("-", " "), pid, self.attempt._host,
                    f"was stopped (SIGSTOP) for {now - since:.1f} s while the other ranks "
                    f"waited for it in rabit_py"):
                del self.frozen_since[pid]
        self._end_silent(now, alive)

    def _end_frozen_servers(self, now: float, reports: Dict[str, Report]) -> None:
        """Rule (g) of Note [supervision]: SIGKILL a parameter server's
        process that has been stopped for ``FROZEN_S`` (this host), or whose
        heartbeats stopped for ``SILENT_S`` (another host, through the launch
        agent, as rule (e) ends a silent rank)."""
        for name, report in reports.items():
            if not name.startswith("server-") or report.ok or report.started_by is None:
                continue
            pid, host = report.started_by
            if self.server_pids.setdefault(name, pid) != pid:
                self.server_spawned = True
            who, then = name.replace("-", " "), ("so that its replica serves its parts (or "
                                                 "the job restarts)")
            if host != self.attempt._host:
                beat, last = report.beat, self.beats.get(name)
                if beat is None or beat[5] != pid:
                    continue                # not beating yet
                if last is None or last[0] != beat[0]:
                    self.beats[name] = (beat[0], now)
                elif now - last[1] >= SILENT_S and (name, beat[0]) not in self.silenced:
                    self.silenced.add((name, beat[0]))
                    self.attempt.end_process(
                        "frozen", who, pid, host,
                        f"sent no heartbeat for {now - last[1]:.1f} s, holding the workers' "
                        f"pulls (a stopped process, or one where Python no longer runs)", then)
                continue
            if not is_stopped(pid, traced=False):
                self.servers_frozen_since.pop(pid, None)
                continue
            since = self.servers_frozen_since.setdefault(pid, now)
            if now - since >= FROZEN_S and self.attempt.end_process(
                    "frozen", who, pid, host, f"was stopped (SIGSTOP) for {now - since:.1f} s, "
                                              f"holding the workers' pulls", then):
                del self.servers_frozen_since[pid]

    def _end_silent(self, now: float, alive: Dict[str, Report]) -> None:
        """Rule (e) for a rank on another host, whose process state cannot be
        read from here: its heartbeats stopped for ``SILENT_S`` (the
        watchdog thread beats every second whatever the program does, so a
        stopped process, or one stuck without Python running) while a rank
        that still beats waits inside rabit_py: ended through the launch
        agent."""
        silent = {}
        for name, report in alive.items():
            beat, last = report.beat, self.beats.get(name)
            newer = report.started_by is not None and report.started_by[0] != beat[5] \
                if beat is not None else False     # a replacement that has not beaten yet
            if beat is not None and beat[6] != self.attempt._host and last is not None \
                    and not newer and report.state != "done" and now - last[1] >= SILENT_S:
                silent[name] = now - last[1]
        waiting = any(r.state not in COMPUTING for n, r in alive.items() if n not in silent)
        if not waiting:
            return
        for name, quiet in sorted(silent.items()):
            beat = alive[name].beat
            if (name, beat[0]) in self.silenced:
                continue
            self.silenced.add((name, beat[0]))
            self.attempt.end_process(
                "frozen", name.replace("-", " "), beat[5], beat[6],
                f"sent no heartbeat for {quiet:.1f} s while the other ranks waited for it in "
                f"rabit_py (a stopped process, or one where Python no longer runs)")

    def _end_hung(self, alive: Dict[str, Report]) -> None:
        """Rule (f) of Note [supervision] (Note [hung ranks] in
        ``engine/_watchdog.py``): ranks asked to end the ranks that hold their
        call past the collective timeout; SIGKILL those in their own code and
        behind that call (on this host), as rule (e) does."""
        waiting: Dict[Tuple[int, int], List[Tuple[str, float]]] = {}
        for name, report in alive.items():
            request = report.overdue
            if request is None or (name, request[4]) in self.overdue_seen:
                continue
            self.overdue_seen.add((name, request[4]))
            if time.time() - request[4] <= OVERDUE_FRESH_S:   # else: a call that ended since
                waiting.setdefault(request[:2], []).append((name.split("-", 1)[1], request[3]))
        for (version, seqno), waiters in sorted(waiting.items()):
            for other, r in sorted(alive.items()):
                beat = r.beat
                # Behind the call: in the program's code after an earlier
                # call, or in the call's own prepare_fun.
                if beat is None or beat[5] in self.hung_killed or not (
                        (r.state == "user" and (beat[1], beat[2]) < (version, seqno)) or
                        (r.state == "prepare" and (beat[1], beat[2]) == (version, seqno))):
                    continue
                who = ", ".join(w for w, _ in sorted(waiters, key=lambda w: int(w[0])))
                place = (f"in its own code after call #{beat[2]} of version {beat[1]}"
                         if r.state == "user" else "in the prepare_fun of that call")
                if self.attempt.end_process(
                        "hung", other.replace("-", " "), beat[5], beat[6],
                        f"was {place} while rank(s) {who} waited "
                        f"{max(t for _, t in waiters):.1f} s for it in call #{seqno} of version "
                        f"{version}, past the collective timeout"):
                    self.hung_killed.add(beat[5])

    @staticmethod
    def _stuck_spawn(ranks: Dict[str, Report], alive: Dict[str, Report]) -> Optional[str]:
        """Why the ranks' spawn is stuck (Note [stuck spawn]), or None."""
        spawning = [r for r in alive.values() if r.state == "spawn"]
        if not spawning:
            return None
        targets = frozenset().union(*(r.spawning for r in spawning))
        died = sorted(int(n.split("-", 1)[1]) for n, r in ranks.items()
                      if r.started and n not in alive and not r.ok and r.failed is None
                      and int(n.split("-", 1)[1]) not in targets)
        if not died:
            return None
        return (f"rank(s) {', '.join(map(str, died))} died while the job was starting "
                f"processes to replace rank(s) {', '.join(map(str, sorted(targets)))}; Open MPI "
                f"cannot finish a spawn once a process taking part died (the repair would "
                f"wait for RABIT_RECOVERY_TIMEOUT)")

    def _alive(self, name: str, report: Report, now: float) -> bool:
        """Whether the rank's process may still be running (True while unknown:
        a rank without heartbeats, e.g. a job of one rank)."""
        if report.ok or report.failed is not None:
            return False
        beat = report.beat
        if beat is None:
            # Started, no heartbeat yet (or a job of one rank, which has none).
            by = report.started_by
            return by is None or by[1] != self.attempt._host or process_alive(by[0])
        if beat[5] != (report.started_by or (beat[5],))[0]:
            # A newer process of this rank started and has not beaten yet.
            by = report.started_by
            return by is None or by[1] != self.attempt._host or process_alive(by[0])
        if beat[6] == self.attempt._host:
            return process_alive(beat[5])
        last = self.beats.get(name)
        if last is None or last[0] != beat[0]:
            self.beats[name] = (beat[0], now)
            return True
        return now - last[1] < BEAT_STALE_S


def teardown_message(reports: Dict[str, Report], processes: List[int],
                     grace: float = EXIT_GRACE_S) -> str:
    """Why rule (c) stops a job whose ranks all finalized (Note [teardown
    hang]): the processes left, and whether they are past rabit_py's exit
    (their exit report is written: they are inside MPI_Finalize) or not."""
    names = {r.started_by[0]: name for name, r in reports.items() if r.started_by}
    past_exit = {r.started_by[0] for r in reports.values()
                 if r.started_by and (r.ok or r.failed is not None)}
    left = sorted(processes)
    inside = [f"{names[pid]} (pid {pid})" for pid in left if pid in past_exit]
    others = [f"{names.get(pid, 'a process')} (pid {pid})" for pid in left
              if pid not in past_exit]
    head = f"every rank finalized but the job did not exit within {grace:g} s: "
    if others:
        return head + f"{', '.join(others)} did not end"
    return head + (f"{', '.join(inside) or 'its processes'} ended rabit_py and hang in MPI's "
                   f"own teardown (MPI_Finalize's fence; an Open MPI bug after spawned "
                   f"processes, open-mpi/ompi#9434, #13127)")

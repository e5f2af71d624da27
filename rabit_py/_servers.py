"""Server processes beside the workers: how a job's processes split into
the two roles, and how a replacement worker reaches the servers (a contract
between the engine, which runs on the workers, ``rabit_py.kvstore``, and
``rabit_py.kvstore.server``, which runs on the servers).

# Note [server processes]
A job with parameter servers (``RABIT_SERVERS=S``, set by ``rabit-run
--servers S``) is one MPI job of ``W + S`` processes, started as two
programs (``mpirun -n W python train.py : -n S python -m
rabit_py.kvstore.server``): ranks ``0 .. W-1`` of ``MPI.COMM_WORLD`` are the
workers, the last ``S`` the servers. Every process, in ``rabit_py.init()``
on a worker and at the start of the server program, makes the same calls
over ``COMM_WORLD``, in this order:

1. ``Split`` by role (workers: colour 0, servers: colour 1, in world order):
   the workers' engine runs on the workers' part, so its collectives never
   involve a server;
2. ``Dup``: the *link*, on which workers and servers exchange the store's
   requests and replies point to point (never a collective), apart from any
   traffic of the program's own on ``COMM_WORLD``;
3. the first server opens an MPI port and sends its name to every worker on
   the link (:data:`PORT_TAG`): where a replacement worker, which is not in
   ``COMM_WORLD``, connects to the servers (:func:`connect_replacement`).

A worker's ``rabit_py.finalize()`` sends every server one empty message
tagged :data:`BYE_TAG` on its link; a server ends once every worker said
goodbye.

When a server dies, the surviving servers start its replacement
(:func:`spawn_server`, :func:`join_servers`; Note [replaced servers] in
``kvstore/server.py``): it is outside ``COMM_WORLD``, so it opens a port for
each worker and one surviving server tells each worker the port of its own
(:data:`MOVED_TAG`, ``(server index, port)``), where the worker connects and
says which worker it is (:data:`HELLO_TAG`).

Spares (``RABIT_SPARES``) are taken from the end of ``COMM_WORLD`` too; the
two are not combined yet (refused at ``init``).
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Set, Tuple

__all__ = ["WORKER", "SERVER", "BYE_TAG", "PORT_TAG", "HELLO_TAG", "MOVED_TAG", "split_world",
           "say_goodbye", "server_ranks", "connect_replacement", "acknowledge_failures",
           "spawn_server", "join_servers", "port_service", "publish_port", "current_port"]

WORKER = 0
SERVER = 1
BYE_TAG = 999
PORT_TAG = 998
HELLO_TAG = 997
MOVED_TAG = 996


def split_world(world: Any, servers: int, role: int) -> Tuple[Any, Any, str]:
    """Note [server processes]: the calls every process of the job makes.
    Returns ``(own_role_comm, link, port)``; the link returns errors
    (``ERRORS_RETURN``) instead of aborting.

    Args:
        world: ``MPI.COMM_WORLD`` (mpi4py).
        servers: the number of server processes (``RABIT_SERVERS``).
        role: :data:`WORKER` or :data:`SERVER`.

    Raises:
        ValueError: ``servers`` leaves no worker, or this process's rank
            does not fit its role (a server among the first ranks).
    """
    from mpi4py import MPI

    size, rank = world.Get_size(), world.Get_rank()
    if servers < 1 or servers >= size:
        raise ValueError(f"RABIT_SERVERS={servers} with {size} processes in the job: need at "
                         f"least one worker and one server (start the job with rabit-run -n W "
                         f"--servers S, or mpirun -n W ... : -n S python -m "
                         f"rabit_py.kvstore.server)")
    expected = SERVER if rank >= size - servers else WORKER
    own = world.Split(role, rank)
    link = world.Dup()
    link.Set_errhandler(MPI.ERRORS_RETURN)
    if role != expected:
        name = "server" if role == SERVER else "worker"
        raise ValueError(f"process {rank} of {size} is a {name}, but with RABIT_SERVERS="
                         f"{servers} the last {servers} processes are the servers: start the "
                         f"workers' program first (mpirun -n W python train.py : -n {servers} "
                         f"python -m rabit_py.kvstore.server)")
    first_server = size - servers
    if role == SERVER:
        port = MPI.Open_port() if own.Get_rank() == 0 else None
        port = own.bcast(port, root=0)
        if own.Get_rank() == 0:
            for worker in range(first_server):
                link.send(port, dest=worker, tag=PORT_TAG)
    else:
        port = link.recv(source=first_server, tag=PORT_TAG)
    return own, link, port


# Note [the servers' port]
# A replacement worker connects to the port of server 0, whose name every
# worker learnt at the job's start (and a replacement from the replayed
# broadcast at the store's creation). When server 0 dies and a new process
# takes its place (Note [replaced servers] in kvstore/server.py), that port
# dies with it, and MPI_Comm_connect to a dead process's port hangs (Open MPI
# 5.0.11). So server 0 publishes its port (MPI_Publish_name, kept by the MPI
# runtime) under a name made of the first port and a *generation*, the
# number of times server 0 was replaced: each new server 0 publishes its own
# port under the next generation, and a replacement worker looks the names
# up and connects to the newest port found (the first port where the
# runtime publishes nothing: a job started outside mpirun's runtime). A name
# that is missing costs a look-up ~0.1 ms, and the runtime may drop a dead
# publisher's names, so the look-up goes on past missing generations.
_SERVICE_PREFIX = "rabit_py-kvstore-"
_LOOKUP_MISSES = 8


def port_service(port: str) -> str:
    """The name under which the servers publish their port (Note [the
    servers' port]), made from the job's first port."""
    return _SERVICE_PREFIX + port


def publish_port(service: str, generation: int, port: str) -> bool:
    """Publish ``port`` as generation ``generation`` of ``service``; whether
    the MPI runtime took it."""
    from mpi4py import MPI

    try:
        MPI.Publish_name(f"{service}-{generation}", port)
    except MPI.Exception:
        return False
    return True


def current_port(first_port: str) -> str:
    """The servers' newest published port (Note [the servers' port]), or
    ``first_port`` where none is published."""
    from mpi4py import MPI

    service, port, generation, misses = port_service(first_port), first_port, 0, 0
    while misses < _LOOKUP_MISSES:
        try:
            port = MPI.Lookup_name(f"{service}-{generation}")
            misses = 0
        except MPI.Exception:
            misses += 1
        generation += 1
    return port


def connect_replacement(port: str, rank: int) -> Any:
    """A replacement worker (spawned by the job's in-job recovery, outside
    ``COMM_WORLD``) connects to the servers' port: the intercommunicator
    that is its link (the servers are its remote group), after telling them
    its rank (:data:`HELLO_TAG`). ``port``: the job's first port (Note
    [the servers' port]). Raises ``MPI.Exception``."""
    from mpi4py import MPI

    link = MPI.COMM_SELF.Connect(current_port(port), root=0)
    link.Set_errhandler(MPI.ERRORS_RETURN)
    for server in range(link.Get_remote_size()):
        link.send(rank, dest=server, tag=HELLO_TAG)
    return link


def server_ranks(link: Any, servers: int) -> range:
    """The servers' ranks on the link (the last ``servers`` of the job's
    link; every remote rank of a replacement's)."""
    if link.Is_inter():
        return range(link.Get_remote_size())
    size = link.Get_size()
    return range(size - servers, size)


def say_goodbye(link: Any, servers: int) -> None:
    """A worker leaving the job: one :data:`BYE_TAG` message to every server
    (Note [server processes]). Never raises: a dead server cannot be told."""
    requests = []
    for server in server_ranks(link, servers):
        try:
            requests.append(link.isend(None, dest=server, tag=BYE_TAG))
        except Exception:  # noqa: BLE001 - a dead server needs no goodbye
            pass
    for request in requests:
        try:
            request.wait()
        except Exception:  # noqa: BLE001
            pass


def acknowledge_failures(comm: Any, exc: Any, known: Optional[Set[int]] = None) -> List[int]:
    """After ``exc`` from an operation on ``comm`` (the link, a replacement's
    connection, the servers' own communicator): if it says that a process
    died (ULFM's ``MPI_ERR_PROC_FAILED``, or ``_PENDING`` for a receive from
    any source), acknowledge the failures, so that such receives work again,
    and return the dead ranks (remote ranks on an intercommunicator). MPI
    reports every failure of the communicator so far, the old ones too:
    with ``known`` (the ranks the caller already acted on, updated here),
    only the new ones are returned.

    Raises:
        ``exc`` itself for any other error.
    """
    from mpi4py import MPI

    # Open MPI's values where mpi4py lacks the names.
    dead_process = (getattr(MPI, "ERR_PROC_FAILED", 75),
                    getattr(MPI, "ERR_PROC_FAILED_PENDING", 76))
    if not isinstance(exc, MPI.Exception) or exc.Get_error_class() not in dead_process:
        raise exc
    comm.Ack_failed()
    group = comm.Get_failed()
    try:
        base = comm.Get_remote_group() if comm.Is_inter() else comm.Get_group()
        try:
            dead = [r for r in MPI.Group.Translate_ranks(group, list(range(group.Get_size())),
                                                         base) if r >= 0]
        finally:
            base.Free()
        if known is not None:
            dead = [r for r in dead if r not in known]
            known.update(dead)
        return dead
    finally:
        group.Free()


def spawn_server(survivors: Any, index: int, me: int) -> Any:
    """The surviving servers' side of replacing dead server ``index``
    (Note [server processes]): collective over ``survivors`` (the servers'
    own communicator, shrunk), whose first rank spawns one ``python -m
    rabit_py.kvstore.server --replaces INDEX``. ``me``: this server's index.
    Returns the servers' new own communicator, ranked by server index (the
    new process at ``index``), errors returned. Raises ``MPI.Exception``."""
    from mpi4py import MPI

    from ._spawn import spawn_info

    info = spawn_info() if survivors.Get_rank() == 0 else MPI.INFO_NULL
    inter = survivors.Spawn(sys.executable, args=["-m", "rabit_py.kvstore.server",
                                                  "--replaces", str(index)],
                            maxprocs=1, root=0, info=info)
    return _in_server_order(inter, False, me)


def join_servers(index: int) -> Any:
    """The new server's side of :func:`spawn_server`: its own communicator
    with the surviving servers, where it is rank ``index``."""
    from mpi4py import MPI

    return _in_server_order(MPI.Comm.Get_parent(), True, index)


def _in_server_order(inter: Any, high: bool, index: int) -> Any:
    from mpi4py import MPI

    inter.Set_errhandler(MPI.ERRORS_RETURN)
    merged = inter.Merge(high=high)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    own = merged.Split(0, index)
    own.Set_errhandler(MPI.ERRORS_RETURN)
    merged.Free()
    return own

"""Local models kept on other ranks, and how a replacement gets them back.

Each rank sends its local model (``checkpoint(global, local)``) to its
``RABIT_REPLICAS`` successors on the ring at every checkpoint, and keeps what
its predecessors sent. When ranks are replaced, the survivors serve the
committed global model (from the lowest rank that holds a version) and each
replacement's local model (from a rank that keeps a replica of it). Note
[robust protocol] in ``robust.py`` says when.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from .._mpistart import MPI

from .. import _control as control
from .._tags import LOCAL_MODEL_TAG
from .._versions import Checkpoints

__all__ = ["Replicas", "Holding"]

# (asks for the checkpoint, holds a version, owners of the replicas held,
# keeps a local model): what the ranks exchange to find who can give a
# replacement its local model.
Holding = Tuple[bool, bool, List[int], bool]


class Replicas:
    """The replicas this rank keeps (owner rank -> its local model bytes).

    Args:
        copies: ``RABIT_REPLICAS``, how many successors keep each local model.
    """

    def __init__(self, copies: int) -> None:
        self.copies = copies
        self.held: Dict[int, Optional[bytes]] = {}
        self._none_held: Tuple[Tuple[int, int], Dict[int, Optional[bytes]]] = ((-1, -1), {})

    def exchange(self, comm: Any, blob: Optional[bytes]) -> Dict[int, Optional[bytes]]:
        """Send ``blob`` to the ring successors; return what the predecessors
        sent (owner rank -> blob), for the caller to keep once committed."""
        rank, size = comm.Get_rank(), comm.Get_size()
        got: Dict[int, Optional[bytes]] = {}
        for i in range(1, min(self.copies, size - 1) + 1):
            src = (rank - i) % size
            got[src] = control.sendrecv(comm, blob, (rank + i) % size, src,
                                        LOCAL_MODEL_TAG + i, "replicas.exchange")
        return got

    def none_held(self, rank: int, size: int) -> Dict[int, Optional[bytes]]:
        """What :meth:`exchange` returns when no rank has a local model (a
        lazy checkpoint), without the messages. The same dict while rank and
        size stay (``held`` is replaced, never changed in place): a training
        loop makes one at every iteration."""
        if self._none_held[0] != (rank, size):
            self._none_held = ((rank, size), {(rank - i) % size: None
                                              for i in range(1, min(self.copies, size - 1) + 1)})
        return self._none_held[1]

    def holding(self, requesting: bool, has_version: bool, has_local: bool) -> Holding:
        """This rank's :data:`Holding`."""
        return (requesting, has_version, sorted(self.held) if has_version else [], has_local)

    @staticmethod
    def lost(holdings: List[Holding], dead: List[int]) -> Optional[int]:
        """A dead rank whose local model no living rank keeps, if local models
        are in use; else None."""
        if not any(h[3] for h in holdings):
            return None
        kept = {owner for h in holdings if h[1] for owner in h[2]}
        return next((owner for owner in dead if owner not in kept), None)

    def serve(self, comm: Any, requesting: bool, has_version: bool,
              checkpoints: Checkpoints, lost: Callable[[int], BaseException]
              ) -> Tuple[Optional[bytes], Optional[bytes]]:
        """Give the requesting ranks the committed checkpoint (collective on
        ``comm``). Returns (global blob, this rank's local blob) for a
        requester to commit. Raises ``lost(owner)`` when a requester's local
        model is kept nowhere."""
        rank, size = comm.Get_rank(), comm.Get_size()
        root = control.reduce_int(comm, rank if has_version else size, MPI.MIN)
        blob = checkpoints.global_bytes() if rank == root else None
        blob = control.bcast(comm, blob, root, "replicas.global")
        holdings = control.allgather(comm, self.holding(requesting, has_version,
                                                        checkpoints.local_blob is not None),
                                     "replicas.holdings")
        uses_local = any(h[3] for h in holdings)
        mine = checkpoints.local_blob
        for owner, (asks, owner_has_version, _, _) in enumerate(holdings):
            if not asks or owner_has_version:
                continue
            holder = next((r for r, h in enumerate(holdings) if h[1] and owner in h[2]), None)
            if holder is None:
                if uses_local:
                    raise lost(owner)
                continue
            if rank == holder:
                control.send(comm, self.held[owner], owner, LOCAL_MODEL_TAG, "replicas.serve")
            elif rank == owner:
                mine = control.recv(comm, holder, LOCAL_MODEL_TAG, "replicas.serve")
        return blob, mine

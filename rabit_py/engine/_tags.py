"""Every MPI tag that rabit_py uses, in one place, so that none collide.

Control communicator (``ctrl``, a duplicate kept for traffic that must flow
after the data communicator was revoked): the watchdog's position exchange
and the notices that end a job. Data communicator: the ring replication of
local models. Pool communicator (spares): the release of a spare.
"""

POSITIONS_TAG = 7311        # _watchdog: where each rank is, after a timeout
TIMEOUT_NOTICE_TAG = 7312   # _watchdog: "I timed out" (Note [timeouts])
FATAL_NOTICE_TAG = 7313     # _lifecycle: "I end the job" (Note [uncaught errors])
LOCAL_MODEL_TAG = 7321      # robust: a local model sent to the ranks that keep its copies
PEER_PROBE_TAG = 7399       # mpi: never sent; probing it only drives MPI's progress
RELEASE_TAG = 7400          # _spares: a spare is released (Note [spares])

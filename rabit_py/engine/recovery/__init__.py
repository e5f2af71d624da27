"""What only the robust engine uses: the result cache it replays from, the
replicas of local models, the repair of the communicators after a failure
(spawned replacements and spares) and how a process joins the job
(Note [repair] in ``_repair.py``, Note [spares] in ``_spares.py``).

Rules (checked by ``tests/unit/test_layout.py``): only ``engine.robust``
(and through it ``engine.mock``) and ``engine.create`` import this package,
through the names below; its modules use the engine's call path (the frame,
control messages, lifecycle) and tier T0, never the engines themselves.
"""

from ._cache import BOOT, BOOT_SHARE, Entry, ResultCache, code_key, default_budget, key_code
from ._enter import Joined, enter_job
from ._join import is_replacement
from ._recovery import Recovery
from ._replicas import Replicas

__all__ = ["BOOT", "BOOT_SHARE", "Entry", "ResultCache", "code_key", "default_budget", "key_code",
           "Joined", "enter_job", "is_replacement", "Recovery", "Replicas"]

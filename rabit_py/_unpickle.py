"""Reading a pickle from a file as data only.

# Note [checkpoints are data]
A pickle is a program: loading one calls whatever functions it names, so
whoever can write into a checkpoint folder (often a shared filesystem) runs
code in every rank of the next job that resumes from it (PyTorch made
``torch.load(weights_only=True)`` its default for this reason). What comes
from a file is therefore loaded by :class:`DataUnpickler`, which resolves
only the names of :data:`DATA_NAMES` -- Python's and NumPy's data types and
the functions that rebuild arrays, dtypes, scalars and random generators from
their bytes -- and the classes the program allowed by name; any other name
ends the load before anything of it ran, with :class:`NotData` naming it.
The trainers' and the KVStore's models are dicts of such data, and
``rabit_py.xgboost``'s a dataclass of it (listed here), which carries the
training callbacks as a pickle of their own, loaded as data too with what
the program's callbacks name (Note [callbacks are data] in
``rabit_py/xgboost/_rounds.py``). Pickles that travel between the job's own ranks (replicas,
replays, broadcasts) are not read from a file and stay plain, as fast as
before.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, FrozenSet, Iterable

__all__ = ["DATA_NAMES", "DataUnpickler", "NotData", "load_data", "qualified_name"]

_NUMPY_CORE = ("numpy.core", "numpy._core")         # NumPy 1.x, 2.x

#: ``module.name`` of every global a data pickle may name.
DATA_NAMES: FrozenSet[str] = frozenset(
    [f"builtins.{n}" for n in ("bool", "int", "float", "complex", "str", "bytes",
                               "bytearray", "list", "tuple", "dict", "set", "frozenset",
                               "slice", "range")]
    + [f"collections.{n}" for n in ("OrderedDict", "defaultdict", "deque", "Counter")]
    + ["copyreg._reconstructor", "numpy.dtype", "numpy.ndarray",
       "numpy.ma.core._mareconstruct", "numpy.ma.core.MaskedArray", "numpy.ma.MaskedArray"]
    + [f"{core}.{n}" for core in _NUMPY_CORE
       for n in ("multiarray._reconstruct", "multiarray.scalar", "numeric._frombuffer")]
    + [f"numpy.random._pickle.{n}" for n in ("__generator_ctor", "__bit_generator_ctor",
                                             "__randomstate_ctor")]
    + [f"numpy.random.{m}.{n}" for m, n in (("_pcg64", "PCG64"), ("_pcg64", "PCG64DXSM"),
                                            ("_mt19937", "MT19937"), ("_philox", "Philox"),
                                            ("_sfc64", "SFC64"),
                                            ("bit_generator", "SeedSequence"),
                                            ("bit_generator", "__pyx_unpickle_SeedSequence"),
                                            ("_generator", "Generator"),
                                            ("mtrand", "RandomState"))]
    # rabit_py's own checkpointed classes (data only: a frozen dataclass).
    + ["rabit_py.xgboost._rounds.BoostState"])


class NotData(pickle.UnpicklingError):
    """A pickle names something that is not data (Note [checkpoints are
    data]); ``name`` is its ``module.name``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"it names {name}, which is not data")
        self.name = name

    def advice(self) -> str:
        """What a refusal's message says after naming where: why nothing
        was loaded and how to allow it."""
        return (f"names {self.name}, which is not data: loading it would run code from the "
                f"file, so nothing of it was loaded. If the file is yours and {self.name} is "
                f"a class of your model, allow it: rabit.init(checkpoint_classes=[...]) or "
                f"RABIT_CHECKPOINT_CLASSES={self.name}; where everyone who can write the "
                f"folder is trusted, RABIT_TRUST_CHECKPOINTS=1 loads any pickle")


class DataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`DATA_NAMES` and ``allowed``
    (``module.name`` strings)."""

    def __init__(self, file: Any, allowed: Iterable[str] = ()) -> None:
        super().__init__(file)
        self._allowed = frozenset(allowed)

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified in DATA_NAMES or qualified in self._allowed:
            return super().find_class(module, name)
        raise NotData(qualified)


def load_data(blob: bytes, allowed: Iterable[str] = ()) -> Any:
    """Unpickle ``blob`` as data only (Note [checkpoints are data]).

    Args:
        blob: the pickle.
        allowed: ``module.name`` of classes that may appear beyond data.

    Raises:
        NotData: the pickle names another global; nothing it names ran.
        pickle.UnpicklingError, EOFError, ValueError, ...: a corrupt pickle.
    """
    return DataUnpickler(io.BytesIO(blob), allowed).load()


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a class (or a ``module.name`` string as it is),
    as :class:`DataUnpickler` takes it.

    Raises:
        TypeError: ``obj`` is neither a class nor a string.
    """
    if isinstance(obj, str):
        return obj
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    raise TypeError(f"a class or a 'module.Name' string is needed, not {type(obj).__name__}")

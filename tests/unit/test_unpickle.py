"""Note [checkpoints are data] (rabit_py/_unpickle.py): what a checkpoint
file may hold, what it may not, and how a program allows its own classes."""

import collections
import os
import pickle
import subprocess

import numpy as np
import pytest

from rabit_py._unpickle import NotData, load_data, qualified_name
from rabit_py.config import Config


class Model:
    def __init__(self) -> None:
        self.weights = np.arange(3.0)


class _RunsCommand:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", self.marker],))


DATA = [np.arange(3.0), np.ones((2, 2), np.float32), np.arange(10)[::2],
        np.array([1, "a", None], dtype=object), np.float32(1.5), np.int64(-3), np.dtype("f8"),
        np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]), np.array(["2020-01-01"], "datetime64[D]"),
        np.ma.array([1, 2], mask=[0, 1]), np.random.default_rng(1), np.random.RandomState(3),
        collections.OrderedDict(a=1), collections.defaultdict(list, {"k": [1]}),
        collections.deque([1, 2]), collections.Counter("aab"), {1, 2}, frozenset([3]), 1 + 2j,
        bytearray(b"ab"), slice(1, 5, 2), range(4),
        {"trees": [{"value": np.ones(4)}], "step": 3, "name": "gbdt", "none": None}]


@pytest.mark.parametrize("value", DATA, ids=lambda v: type(v).__name__)
def test_data_loads_as_it_was_saved(value):
    blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    loaded = load_data(blob)
    assert type(loaded) is type(value)
    # what pickle itself loads from these bytes, to the byte
    assert pickle.dumps(loaded, protocol=4) == pickle.dumps(pickle.loads(blob), protocol=4)


def test_a_pickle_that_would_run_a_command_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    blob = pickle.dumps({"model": [_RunsCommand(str(marker))]})
    with pytest.raises(NotData) as info:
        load_data(blob)
    assert info.value.name == "subprocess.call"
    assert "names subprocess.call, which is not data" in str(info.value)
    assert not marker.exists()
    for module, name in (("builtins", "eval"), ("builtins", "getattr"),
                         (os.system.__module__, "system")):
        with pytest.raises(NotData, match=f"names {module}.{name},"):
            load_data(f"c{module}\n{name}\n.".encode())


def test_a_class_of_the_program_loads_only_when_allowed():
    blob = pickle.dumps(Model())
    with pytest.raises(NotData, match=f"names {__name__}.Model"):
        load_data(blob)
    loaded = load_data(blob, [qualified_name(Model)])
    assert isinstance(loaded, Model) and loaded.weights.tolist() == [0.0, 1.0, 2.0]


def test_the_allowed_classes_come_from_init_or_the_environment():
    config = Config.from_env({}, checkpoint_classes=[Model, "pkg.models.Other"])
    assert config.allowed_checkpoint_classes == (f"{__name__}.Model", "pkg.models.Other")
    config = Config.from_env({"RABIT_CHECKPOINT_CLASSES": "a.B, c.d.E",
                              "RABIT_TRUST_CHECKPOINTS": "yes"})
    assert config.allowed_checkpoint_classes == ("a.B", "c.d.E") and config.trust_checkpoints
    assert Config().allowed_checkpoint_classes == () and not Config().trust_checkpoints
    with pytest.raises(ValueError, match="'Model' is not a 'module.Name'"):
        Config.from_env({}, checkpoint_classes="Model")
    with pytest.raises(TypeError, match="a class or a 'module.Name' string is needed, not int"):
        Config.from_env({}, checkpoint_classes=[3])
    with pytest.raises(ValueError, match="RABIT_TRUST_CHECKPOINTS='maybe'"):
        Config.from_env({"RABIT_TRUST_CHECKPOINTS": "maybe"})

import dataclasses

import pytest

from rabit_py.config import Config


def test_defaults():
    cfg = Config.from_env({})
    assert (cfg.engine, cfg.timeout, cfg.check, cfg.mock, cfg.checkpoint_dir) == \
        ("auto", 600.0, True, "", None)


def test_environment_is_read_and_kwargs_win():
    env = {"RABIT_ENGINE": "mpi", "RABIT_TIMEOUT": "2.5", "RABIT_CHECK": "0",
           "RABIT_CHECKPOINT_DIR": "/tmp/ck", "RABIT_LOG_LEVEL": "debug"}
    cfg = Config.from_env(env)
    assert (cfg.engine, cfg.timeout, cfg.check, cfg.checkpoint_dir, cfg.log_level) == \
        ("mpi", 2.5, False, "/tmp/ck", "debug")
    cfg = Config.from_env(env, timeout=9, check=True)
    assert cfg.timeout == 9 and cfg.check is True


@pytest.mark.parametrize("env,pattern", [
    ({"RABIT_TIMEOUT": "soon"}, "RABIT_TIMEOUT='soon': expected a number"),
    ({"RABIT_CHECK": "maybe"}, "RABIT_CHECK='maybe': expected 1/0"),
    ({"RABIT_ENGINE": "magic"}, "engine='magic' is not one of"),
    ({"RABIT_TIMEOUT": "-1"}, "timeout=-1.0 must be a number of seconds >= 0"),
    ({"RABIT_LOG_LEVEL": "loud"}, "log_level='loud'"),
    ({"RABIT_SPARES": "-1"}, "spares=-1 must be an integer >= 0"),
])
def test_bad_values_name_the_setting(env, pattern):
    with pytest.raises(ValueError, match=pattern):
        Config.from_env(env)


def test_unknown_keyword_is_refused():
    with pytest.raises(TypeError, match="unknown rabit_py setting.*timout.*valid ones are"):
        Config.from_env({}, timout=3)


def test_unknown_variable_warns():
    with pytest.warns(UserWarning, match="RABIT_TIMOUT is not a rabit_py setting"):
        Config.from_env({"RABIT_TIMOUT": "3"})


def test_frozen():
    cfg = Config.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.timeout = 1  # type: ignore[misc]


def test_robust_settings():
    cfg = Config.from_env({"RABIT_REPLICAS": "2", "RABIT_MAX_RECOVERIES": "3"})
    assert (cfg.replicas, cfg.max_recoveries) == (2, 3)
    with pytest.raises(ValueError, match="RABIT_REPLICAS='two': expected an integer"):
        Config.from_env({"RABIT_REPLICAS": "two"})
    with pytest.raises(ValueError, match="max_recoveries=-1 must be an integer >= 0"):
        Config.from_env({}, max_recoveries=-1)


def test_shared_memory_settings():
    cfg = Config.from_env({})
    assert (cfg.shm, cfg.shm_min_bytes, cfg.node_size) == (True, 32 << 20, 0)
    cfg = Config.from_env({"RABIT_SHM": "0", "RABIT_SHM_MIN_BYTES": "1024",
                           "RABIT_NODE_SIZE": "2"})
    assert (cfg.shm, cfg.shm_min_bytes, cfg.node_size) == (False, 1024, 2)
    with pytest.raises(ValueError, match="RABIT_NODE_SIZE='two': expected an integer"):
        Config.from_env({"RABIT_NODE_SIZE": "two"})
    with pytest.raises(ValueError, match="shm_min_bytes=-1 must be an integer >= 0"):
        Config.from_env({}, shm_min_bytes=-1)


def test_result_copies_must_survive_a_single_failure():
    assert Config.from_env({"RABIT_RESULT_COPIES": "2"}).result_copies == 2
    with pytest.raises(ValueError, match="result_copies=1 would lose a result"):
        Config.from_env({}, result_copies=1)


def test_the_status_folder_variable_is_the_one_rabit_run_sets():
    from rabit_py._status import STATUS_DIR_VARIABLE
    from rabit_py.launcher._supervisor import STATUS_DIR_VARIABLE as launcher_side

    assert launcher_side is STATUS_DIR_VARIABLE
    assert Config.from_env({STATUS_DIR_VARIABLE: "/tmp/x"}).run_status_dir == "/tmp/x"

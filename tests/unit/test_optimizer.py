"""The KVStore optimizers against hand-written update rules, their states, and
bad hyper-parameters."""

import numpy as np
import pytest

from rabit_py.kvstore.optimizer import SGD, Adam, Updater, create, get_updater


def test_sgd_without_momentum_clips_rescales_and_decays():
    weight = np.array([1.0, -2.0, 3.0])
    grad = np.array([10.0, -0.5, 0.2])
    updater = get_updater(SGD(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=1.0))
    updater("k", grad, weight)
    g = np.clip(grad * 0.5, -1, 1) + 0.01 * np.array([1.0, -2.0, 3.0])
    np.testing.assert_array_equal(weight, np.array([1.0, -2.0, 3.0]) - 0.1 * g)
    assert updater.states["k"] is None and updater.counts["k"] == 1


def test_sgd_momentum_two_steps():
    weight = np.zeros(2)
    updater = Updater(SGD(learning_rate=0.5, momentum=0.9))
    updater(0, np.array([1.0, 2.0]), weight)
    updater(0, np.array([1.0, 2.0]), weight)
    m1 = -0.5 * np.array([1.0, 2.0])
    m2 = 0.9 * m1 - 0.5 * np.array([1.0, 2.0])
    np.testing.assert_allclose(weight, m1 + m2, rtol=1e-15)
    np.testing.assert_allclose(updater.states[0], m2, rtol=1e-15)


def test_adam_bias_correction_per_key():
    updater = Updater(Adam(learning_rate=0.1))
    a, b = np.array([1.0]), np.array([1.0])
    updater("a", np.array([2.0]), a)
    updater("a", np.array([2.0]), a)
    updater("b", np.array([2.0]), b)          # b's first step: its own count
    # With a constant gradient every bias-corrected Adam step moves by lr.
    assert b[0] == pytest.approx(0.9, rel=1e-6)
    assert a[0] == pytest.approx(1.0 - 0.2, rel=1e-6)
    assert updater.counts == {"a": 2, "b": 1}


def test_float32_weights_stay_float32():
    weight = np.ones(3, dtype=np.float32)
    updater = Updater(Adam())
    updater(1, np.ones(3, dtype=np.float32), weight)
    assert weight.dtype == np.float32 and updater.states[1][0].dtype == np.float32


def test_states_round_trip_and_refuse_another_optimizer():
    updater = Updater(SGD(learning_rate=0.1, momentum=0.5))
    weight = np.ones(2)
    updater("w", np.ones(2), weight)
    saved = updater.get_states()
    updater.states["w"][...] = 99               # a copy was saved
    again = Updater(SGD(learning_rate=0.1, momentum=0.5))
    again.set_states(saved)
    np.testing.assert_array_equal(again.states["w"], [-0.1, -0.1])
    assert again.counts == {"w": 1} and saved["optimizer"]["momentum"] == 0.5
    with pytest.raises(ValueError, match="saved by 'sgd'"):
        Updater(Adam()).set_states(saved)


def test_bad_hyper_parameters():
    with pytest.raises(ValueError, match="momentum"):
        SGD(momentum=1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        SGD(learning_rate=-1)
    with pytest.raises(ValueError, match="clip_gradient"):
        SGD(clip_gradient=0)
    with pytest.raises(ValueError, match="beta1"):
        Adam(beta1=1.0)
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        create("rmsprop")
    assert isinstance(create("ADAM", learning_rate=0.5), Adam)
    with pytest.raises(TypeError, match="Optimizer"):
        Updater("sgd")

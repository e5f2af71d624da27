"""A stand-in for a CuPy array where no GPU is lent: its type comes from a
module named ``cupy...`` (which is how rabit_py recognizes device arrays) and
it has what host staging uses: ``get``, ``set``, ``shape``, ``dtype``."""

import numpy as np


class FakeDeviceArray:
    __module__ = "cupy._core.core"

    def __init__(self, host):
        self._host = np.array(host)
        self.shape, self.dtype = self._host.shape, self._host.dtype

    def get(self, out=None):
        if out is None:
            return self._host.copy()
        out[...] = self._host           # CuPy: into a host array of the same shape
        return out

    def set(self, host):
        assert host.shape == self.shape and host.dtype == self.dtype
        self._host[...] = host

    def fill(self, value):
        self._host[...] = value

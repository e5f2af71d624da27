"""BSP trainers driven by the public rabit_py API (GBDT, linear, k-means, MLP).

They need the ``trainers`` extra (scikit-learn for the estimator classes,
tqdm for progress, numba for the GBDT kernels): without scikit-learn the
import stops here with a message that says what to install.
"""

from rabit_py.extras import missing as _missing

if _missing("sklearn"):
    raise ModuleNotFoundError(
        "rabit_py's trainers need scikit-learn, which is not installed: pip install -e "
        "\".[trainers]\" from a checkout (or pip install \"rabit_py[trainers]\")",
        name="sklearn")

__all__: list = []

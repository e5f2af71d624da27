"""BSP trainers driven by the public rabit_py API (GBDT, linear, k-means, MLP).

The trainers arrive with their own issue; this package is installed now so that
``import trainers`` resolves and the layering (trainers know only
``rabit_py``'s public API) is fixed from the start.
"""

__all__: list = []

"""What someone who can write into a checkpoint folder may leave there."""

import os


class Planted:
    """Pickled, it makes a pickle whose loading runs ``touch marker`` (Note
    [checkpoints are data] in ``rabit_py/_unpickle.py``): a test checks that
    the marker never appears."""

    def __init__(self, marker: str) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))

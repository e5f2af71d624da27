"""A program whose durable checkpoint holds an object of its own class.

Run it twice on one ``--checkpoint-dir``: the second run resumes from the
first one's last version, if the class is allowed (Note [checkpoints are
data] in rabit_py/_unpickle.py). Rank 0 prints ``RESUMED <version> <steps>``
after ``load_checkpoint`` and ``RESULT <version> <steps>`` at the end.
"""

import argparse
import sys

import numpy as np

import rabit_py as rabit


class Model:
    """Not data: a class of the program."""

    def __init__(self) -> None:
        self.steps = 0
        self.weights = np.zeros(3)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rabit.init()
    version, model = rabit.load_checkpoint()
    if rabit.get_rank() == 0:
        print(f"RESUMED {version} {0 if model is None else model.steps}", flush=True)
    if model is None:
        model = Model()
    for _ in range(version, args.rounds):
        grad = np.ones(3)
        rabit.allreduce(grad, rabit.Op.SUM)
        model.weights += grad
        model.steps += 1
        rabit.checkpoint(model)
    if rabit.get_rank() == 0:
        print(f"RESULT {rabit.version_number()} {model.steps}", flush=True)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

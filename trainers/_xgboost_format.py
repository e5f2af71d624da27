"""Our GBDT model in XGBoost's JSON model format, so that XGBoost (and what
serves XGBoost models) can load it.

# Note [xgboost json]
Learned from models that XGBoost 3.2 saves (``Booster.save_model("m.json")``)
and its documentation of the JSON schema:

- ``learner.gradient_booster.model.trees``: one object per tree with
  parallel arrays over nodes (root 0): ``left_children``/``right_children``
  (-1 at leaves), ``parents`` (2147483647 at the root), ``split_indices``
  (feature), ``split_conditions`` (the threshold; at a leaf, the leaf value),
  ``default_left`` (where a missing value goes), ``split_type`` (0:
  numerical), ``base_weights``, ``loss_changes``, ``sum_hessian`` (statistics
  only: not used to predict; we store the leaf values and zeros) and
  ``tree_param``. A row goes left when ``value < split_condition``, as ours.
  ``tree_info`` is each tree's output group (class); ``iteration_indptr``
  where each boosting round's trees start.
- ``learner.learner_model_param.base_score`` is a list (``"[v]"``, one per
  class for ``multi:softprob``) in the objective's *output* space: XGBoost
  turns it into a margin with the objective's ``ProbToMargin`` (logit for
  ``binary:logistic``, identity for the other two). Our ``base_score`` is a
  margin, so ``binary:logistic`` writes its sigmoid.
- XGBoost keeps thresholds and leaf values in float32 and reads features as
  float32: a feature value within float32 rounding of a threshold may go the
  other way, and predictions differ by float32 rounding of the sums (about
  1e-7 relative).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np

__all__ = ["to_xgboost_json"]

_ROOT_PARENT = 2147483647
_OBJECTIVE_PARAMS = {
    "binary:logistic": lambda p: {"reg_loss_param": {"scale_pos_weight": "1"}},
    "reg:squarederror": lambda p: {"reg_loss_param": {"scale_pos_weight": "1"}},
    "multi:softprob": lambda p: {"softmax_multiclass_param": {"num_class": str(p["num_class"])}},
}


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _number(x: float) -> str:
    # XGBoost writes its parameters as strings; repr round-trips the float.
    return repr(float(x))


def _tree(tree: Dict[str, np.ndarray], tree_id: int, n_features: int) -> Dict[str, Any]:
    left = tree["left"].astype(np.int64)
    right = tree["right"].astype(np.int64)
    n = len(left)
    leaf = left < 0
    parents = np.full(n, _ROOT_PARENT, dtype=np.int64)
    for node in np.flatnonzero(~leaf):
        parents[left[node]] = node
        parents[right[node]] = node
    conditions = np.where(leaf, tree["value"], tree["threshold"])
    return {
        "base_weights": [float(v) for v in np.where(leaf, tree["value"], 0.0)],
        "categories": [], "categories_nodes": [], "categories_segments": [],
        "categories_sizes": [],
        "default_left": [int(bool(d) and not l) for d, l in zip(tree["default_left"], leaf)],
        "id": tree_id,
        "left_children": [int(v) if v >= 0 else -1 for v in left],
        "loss_changes": [0.0] * n,
        "parents": [int(v) for v in parents],
        "right_children": [int(v) if v >= 0 else -1 for v in right],
        # Note [missing-only child] in gbdt.py: +inf, above every float32
        # value XGBoost reads, is written as float32's largest (JSON has no inf).
        "split_conditions": [float(min(v, _FLOAT32_MAX)) for v in conditions],
        "split_indices": [int(f) if not l else 0 for f, l in zip(tree["feature"], leaf)],
        "split_type": [0] * n,
        "sum_hessian": [0.0] * n,
        "tree_param": {"num_deleted": "0", "num_feature": str(n_features),
                       "num_nodes": str(n), "size_leaf_vector": "1"},
    }


def to_xgboost_json(params: Dict[str, Any], base_score: float, n_features: int,
                    trees: List[Dict[str, np.ndarray]], per_round: int) -> Dict[str, Any]:
    """The model (as :class:`trainers.gbdt.Booster` holds it) in XGBoost's
    JSON schema (Note [xgboost json]).

    Raises:
        ValueError: an objective XGBoost's format cannot express here.
    """
    objective = params["objective"]
    if objective not in _OBJECTIVE_PARAMS:
        raise ValueError(f"objective {objective!r} cannot be written in XGBoost's format")
    if objective == "binary:logistic":
        score = [1.0 / (1.0 + math.exp(-base_score))]
    elif objective == "multi:softprob":
        score = [base_score] * per_round
    else:
        score = [base_score]
    rounds = len(trees) // per_round
    return {
        "learner": {
            "attributes": {},
            "feature_names": [],
            "feature_types": [],
            "gradient_booster": {
                "model": {
                    "cats": {"enc": [], "feature_segments": [], "sorted_idx": []},
                    "gbtree_model_param": {"num_parallel_tree": "1",
                                           "num_trees": str(len(trees))},
                    "iteration_indptr": [r * per_round for r in range(rounds + 1)],
                    "tree_info": [i % per_round for i in range(len(trees))],
                    "trees": [_tree(t, i, n_features) for i, t in enumerate(trees)],
                },
                "name": "gbtree",
            },
            "learner_model_param": {
                "base_score": "[" + ",".join(_number(s) for s in score) + "]",
                "boost_from_average": "1",
                "num_class": str(per_round if objective == "multi:softprob" else 0),
                "num_feature": str(n_features),
                "num_target": "1",
            },
            "objective": {"name": objective, **_OBJECTIVE_PARAMS[objective](params)},
        },
        "version": [3, 2, 0],
    }

"""A real Slurm cluster (Debian's slurmctld and slurmd over namespace hosts,
scripts/slurm_cluster.py), used as a cluster user would from the login node:
salloc, sbatch, a rank killed inside the allocation (replaced in the job), a
node lost (restarted on the nodes left), rabit-run --launcher srun (a rank
killed: restarted from the durable checkpoint). Each compared bitwise with a
run on this machine alone. Skips where root, namespaces or the Slurm and
munge packages are missing."""

import re
import sys

import pytest

from .._proc import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import cluster_demo  # noqa: E402
import slurm_cluster  # noqa: E402

CAN_MAKE_CLUSTER, WHY_NOT = slurm_cluster.can_make_cluster()
pytestmark = pytest.mark.skipif(not CAN_MAKE_CLUSTER, reason=f"Slurm cluster: {WHY_NOT}")

RANKS, ROUNDS = 4, 5


@pytest.fixture(scope="module")
def reference():
    return cluster_demo.reference(RANKS, ROUNDS)[0]


@pytest.mark.parametrize("scenario", slurm_cluster.SCENARIOS)
def test_a_job_under_a_real_slurm_gives_the_one_machine_bits(reference, scenario):
    with cluster_demo.Hosts(3, 2) as hosts, slurm_cluster.SlurmCluster(hosts) as slurm:
        record = slurm_cluster.run_scenario(slurm, scenario, RANKS, ROUNDS, timeout=200)
        first, second, third = hosts.names
    out = record["output"]
    assert record["status"] == 0, out[-6000:]
    assert sorted(record["results"]) == list(range(RANKS)), out[-6000:]
    for rank, result in record["results"].items():
        want = reference[rank]
        assert (result["model"], result["local"], result["version"]) == \
            (want["model"], want["local"], want["version"]), \
            f"rank {rank} differs from the one-machine run:\n{out[-6000:]}"
    # The ranks ran on both nodes of the allocation.
    started = set(re.findall(r'"host": "([^"]+)"', out))
    assert {first, second} <= started, out[-6000:]
    if scenario in ("salloc", "sbatch"):
        assert "restart 1 of" not in out and "replaced rank" not in out, out[-6000:]
    if scenario == "kill-rank":
        # Note [spawn inside an allocation]: every slot of the allocation is
        # in use; the replacement shares one instead of failing the repair.
        assert f"slurm_cluster: killed rank {RANKS - 1}" in out, out[-6000:]
        assert f"replaced rank(s) [{RANKS - 1}]" in out, out[-6000:]
        assert "already filled" not in out and "restart 1" not in out, out[-6000:]
    if scenario == "lose-node":
        # Note [slurm nodes]: the restart runs on the nodes Slurm still has.
        assert "a node lost is left out of restarts" in out, out[-6000:]
        assert (f"host(s) {second} cannot be reached (srun of one process there failed"
                in out), out[-6000:]
        assert f"the next attempt runs on {first}, {third}" in out, out[-6000:]
        assert "restart 1 of 2" in out, out[-6000:]
        last = out.rsplit("restart 1 of 2", 1)[1]
        assert set(re.findall(r'"host": "([^"]+)"', last)) == {first, third}, out[-6000:]
    if scenario == "srun":
        # No in-job recovery under srun: the kill costs a restart, from the
        # durable checkpoint.
        assert "restart 1 of 2" in out and "resumed from durable checkpoint" in out, \
            out[-6000:]


# Issue 33: real XGBoost under Slurm (Note [tracker address] in
# rabit_py/xgboost/_session.py: the tracker listens where the other nodes
# reach rank 0).
XGBOOST = cluster_demo.xgboost_program(8)


@pytest.fixture(scope="module")
def xgboost_reference():
    pytest.importorskip("xgboost")
    results = cluster_demo.reference(RANKS, 8, XGBOOST)[0]
    assert sorted(results) == list(range(RANKS)), results
    return results[0]["sha"]


# kill-rank only in CI: a node lost costs XGBoost the same restart as the job
# above (and test_hosts.py's XGBoost kill-host); `python
# scripts/slurm_cluster.py --xgboost --scenario lose-node` runs it.
@pytest.mark.parametrize("scenario", ["kill-rank"])
def test_fault_tolerant_xgboost_under_a_real_slurm_gives_the_one_machine_booster(
        xgboost_reference, scenario):
    with cluster_demo.Hosts(3, 2) as hosts, slurm_cluster.SlurmCluster(hosts) as slurm:
        record = slurm_cluster.run_scenario(slurm, scenario, RANKS, 0, timeout=200,
                                            program=XGBOOST, cue="ROUND 0 2")
        first, second, third = hosts.names
    out = record["output"]
    assert record["status"] == 0, out[-6000:]
    assert sorted(record["results"]) == list(range(RANKS)), out[-6000:]
    for rank, result in record["results"].items():
        assert (result["sha"], result["rounds"]) == (xgboost_reference, 8), \
            f"rank {rank}:\n{out[-6000:]}"
    if scenario == "kill-rank":
        assert f"replaced rank(s) [{RANKS - 1}]" in out, out[-6000:]
    else:
        assert f"the next attempt runs on {first}, {third}" in out, out[-6000:]
        assert "resumed from durable checkpoint" in out, out[-6000:]

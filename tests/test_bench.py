"""The benchmark script runs and writes complete figures (no timing asserted)."""

import json
import sys

from ._proc import rabit_run, run


def test_bench_collectives_writes_every_contender(tmp_path):
    out_json = tmp_path / "bench.json"
    code, out = run(rabit_run(2, sys.executable, "scripts/bench_collectives.py",
                              "--max-bytes", "512", "--batches", "2", "--no-xgboost",
                              "--json", str(out_json)), timeout=180)
    assert code == 0, out
    assert "allreduce float32 SUM, 2 ranks" in out and "broadcast float32, 2 ranks" in out
    result = json.loads(out_json.read_text())
    assert result["ranks"] == 2
    assert [row["bytes"] for row in result["rows"]] == [8, 64, 512]
    names = set(result["contenders"])
    assert {"mpi4py Allreduce in-place", "rabit allreduce check=off",
            "rabit allreduce check=on", "mpi4py Bcast", "rabit broadcast check=off"} <= names
    for row in result["rows"]:
        assert set(row["seconds"]) == names
        assert all(len(s) == 2 and min(s) > 0 for s in row["seconds"].values())

"""Smoke test of benchmarks/run.py: it completes, writes every key, and the naive and fast supervision losses agree.

No timing assertions: ratios on a shared CI machine mean nothing; the benchmark itself asserts the losses agree.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEYS = [
    "supervision_overhead_direct",
    "supervision_speedup_vs_naive",
    "supervision_memory_ratio_direct",
    "single_stream_speedup_vs_visualbert",
    "two_stream_speedup_vs_lxmert",
    "feature_store_speedup_vs_tsv",
    "kv_cache_speedup",
    "mfu_vs_matmul",
    "bert_sdpa_speedup_vs_eager",
    "scaling",
]


def test_benchmark_smoke_run_writes_every_key(tmp_path):
    output = tmp_path / "bench.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--threads", "1", "--json", str(output)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads(output.read_text())
    missing = [key for key in KEYS if key not in results]
    assert not missing, f"missing keys: {missing}"
    for key in KEYS[:-1]:
        assert isinstance(results[key], float) and results[key] > 0, (key, results[key])
    assert abs(results["supervision_loss_fast"] - results["supervision_loss_naive"]) <= 1e-5 * max(
        1.0, abs(results["supervision_loss_fast"])
    )
    scaling = results["scaling"]
    assert len(scaling["regions"]) == 3 and len(scaling["words"]) == 3
    assert "supervision_cost_exponent_regions" in scaling
    assert "| supervision_speedup_vs_naive |" in completed.stdout

"""End to end with a real `remat serve` (SQLite, a temporary folder): a captured step posted over
HTTP is planned by the service, the plan is measured in PyTorch, and `remat.torch.attach` makes
the measurement the plan's `validation`, which the service answers from then on.

The binary is `$REMAT_BIN`, else `$CARGO_TARGET_DIR/release/remat` (the README's test command
builds it before running these tests); without it the test fails, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_torch import Stack

import remat.torch as rt


def remat_binary() -> Path:
    if os.environ.get("REMAT_BIN"):
        return Path(os.environ["REMAT_BIN"])
    target = os.environ.get("CARGO_TARGET_DIR", str(Path(__file__).parents[2] / "target"))
    return Path(target) / "release" / "remat"


@pytest.fixture
def service() -> Iterator[str]:
    binary = remat_binary()
    if not binary.is_file():
        pytest.fail(
            f"no remat binary at {binary}: build it (cargo build --release) or set REMAT_BIN"
        )
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [str(binary), "serve", "--addr", "127.0.0.1:0", "--db", str(Path(d) / "remat.db")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("remat serve: http://"):
                    url = "/".join(line.split()[2].split("/")[:3])
                    break
            else:
                pytest.fail(f"remat serve did not start: {''.join(seen)}")
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def call(method: str, url: str, body: bytes | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def test_a_plan_from_the_service_measured_in_pytorch_shows_its_validation(service: str) -> None:
    torch.manual_seed(0)
    model = Stack(d=48, n=4)
    x = torch.randn(512, 48)
    graph = rt.capture(model, (x,))
    record = call("POST", f"{service}/v1/plans?budget=0.7x&wait=60", json.dumps(graph).encode())
    assert record["status"] == "done", record
    plan = record["plan"]
    assert plan["execution_model"] == "torch-sac"
    # The service's plan is the one the extension makes (one planner, deterministic).
    assert plan["regions"] == rt.plan(graph, plan["budget_bytes"])["regions"]

    v = rt.measure(model, (x,), plan, rounds=1)
    assert v["ok"], v["problems"]
    plan_url = f"{service}/v1/plans/{record['id']}"
    attached = rt.attach(plan_url, v)
    assert attached["plan"]["validation"] == v
    read = call("GET", plan_url)
    validation = read["plan"]["validation"]
    assert validation["device"] == "torch-cpu"
    assert validation["measured_peak_bytes"] == validation["predicted_peak_bytes"]
    assert validation["measured_peak_bytes"] <= plan["budget_bytes"]
    assert validation["grad_max_rel_err"] <= 1e-6

    # A measurement of another plan is refused, naming what differs.
    other = rt.baseline(graph, "none")
    wrong = rt.measure(model, (x,), other, rounds=1)
    with pytest.raises(rt.ServiceError) as e:
        rt.attach(plan_url, wrong)
    assert e.value.status == 422
    assert "predicted_peak_bytes" in str(e.value) or "budget_bytes" in str(e.value)
    assert call("GET", plan_url)["plan"]["validation"] == v

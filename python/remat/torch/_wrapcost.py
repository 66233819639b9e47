"""What wrapping costs: checkpointing's own work, priced per op it dispatches, measured on the
model itself against its fully checkpointed step (docs/torch.md, "What wrapping costs")."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
from torch import nn

from ._capture import Inputs, LossFn, host_copies, put_back
from ._errors import CaptureError, RematTorchError
from ._measure import _timed_step, alternating
from ._plan import baseline, simulate


def price_wrapping(
    model: nn.Module,
    inputs: Inputs,
    graph: dict[str, Any],
    loss_fn: LossFn,
    *,
    rounds: int,
    seed: int,
    device: torch.device,
) -> dict[str, Any]:
    """The graph's `wrap_cost`: the unplanned step's time, and the price per op that a wrapped
    region runs through checkpointing's dispatch modes.

    Times `rounds` alternating pairs (after a warm-up pair) of the unplanned step and of full
    checkpointing (every wrappable region wrapped, nothing kept: the least peak of a plain
    per-block checkpoint, so this never needs more memory than the plans do). The step is the
    unplanned steps' median, full checkpointing's overhead the median of the pairs' ratios (as
    `measure` reports an overhead). What full checkpointing takes beyond the unplanned step and
    its re-run ops' captured times is checkpointing's own work (the policy, the dispatch modes,
    the saved-tensor hooks, the module's Python between the re-run ops): divided by the ops it
    dispatched, it is the price per op. It is priced only where the pairs show it: full
    checkpointing above the unplanned step by more than its re-run ops in so many pairs that
    chance would give as many in at most 5% of runs (all of 5, 8 of 9; never with fewer than 5
    pairs), and by a positive median; otherwise the price is 0 and only the re-run ops count.
    The pairs' times are kept (`pairs`: [unplanned, full] seconds). The model's buffers
    (BatchNorm's running statistics) are put back afterwards."""
    bare = {k: v for k, v in graph.items() if k != "wrap_cost"}
    full = baseline(bare, "full")
    stats = simulate(bare, full)
    rerun = stats["compute_cost"] - stats["base_cost"]
    n_ops = int(stats["wrapped_ops"])
    buffers = host_copies(model)
    try:
        # A graph without a wrappable region times the unplanned step in both (nothing to wrap).
        times = alternating(
            model, full, inputs, rounds, lambda: _timed_step(model, inputs, loss_fn, seed, device)
        )
    except (RematTorchError, RuntimeError) as e:
        raise CaptureError(
            "pricing checkpointing's own work runs the step unplanned and under full "
            "checkpointing, which failed (wrap_rounds=0 skips it; a plan that wraps a region "
            f"would fail alike): {e}"
        ) from e
    finally:
        put_back(model, buffers)
    step = statistics.median(times["base"])
    if not n_ops:
        return {
            "per_op": 0.0,
            "step": step,
            "source": f"unplanned step: median of {rounds} steps; no region can be wrapped",
        }
    pairs = list(zip(times["base"], times["plan"], strict=True))
    ratio = statistics.median(f / u - 1.0 for u, f in pairs)
    extra = ratio * step - rerun
    # Each pair's time beyond the re-run ops: priced only where it is there in enough pairs
    # that chance would not give as many (a sign test at 5%), so that noise is not a price.
    above = sum((f / u - 1.0) * step > rerun for u, f in pairs)
    needed = _sign_test_needs(len(pairs))
    priced = needed is not None and above >= needed and extra > 0
    verdict = (
        f"above them in {above} of {len(pairs)} pairs"
        + (f" ({needed} needed)" if needed is not None else " (too few pairs to tell)")
        + (": priced" if priced else ": not priced")
    )
    return {
        "per_op": extra / n_ops if priced else 0.0,
        "step": step,
        "source": (
            f"{rounds} alternating pairs: unplanned {step * 1e3:.3f} ms (median), full "
            f"checkpointing of {sum(r['wrapped'] for r in full['regions'])} regions "
            f"{ratio:+.2%} (median of the pairs), its re-run ops {rerun * 1e3:.3f} ms "
            f"(captured), {n_ops} ops dispatched; {verdict}"
        ),
        "pairs": [[u, f] for u, f in pairs],
    }


def _sign_test_needs(n: int) -> int | None:
    """The fewest of `n` pairs that must show an effect for chance (each pair either way with
    probability 1/2) to give as many in at most 5% of runs; `None` when even `n` of `n` would
    not (fewer than 5 pairs)."""
    for k in range(n + 1):
        if sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n <= 0.05:
            return k
    return None

"""Type stubs of the Rust extension `remat._remat` (python/src/lib.rs)."""

__version__: str

def plan(graph: str, budget: str) -> str:
    """Plan a `remat.torch-graph` JSON document under `budget` ("8GiB", bytes, "0.5x", "min");
    returns the `remat.torch-plan` document as JSON."""

def simulate(graph: str, plan: str | None = None) -> str:
    """The torch-sac simulator's figures of a plan document on its graph (unplanned without one)."""

def baseline(graph: str, name: str) -> str:
    """The plan document of a fixed policy: "none" (nothing wrapped) or "full" (every region
    checkpointed, nothing kept)."""

def timeline(graph: str, plan: str | None = None) -> str:
    """The simulated memory timeline as JSON: `[{"op", "rerun_of", "bytes"}]`."""

def sweep(graph: str, fractions: list[float] | None = None) -> str:
    """The torch-sac plans at `fractions` of the unplanned peak as JSON: a list of points
    (`budget_bytes`, `fraction`, `status`, `overhead`, `gap`, `bound_source`, `baselines`),
    never rising with the budget."""

"""remat: activation-checkpointing plans."""

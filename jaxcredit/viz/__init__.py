"""Static pages and plots of what the trainer wrote: the per-token credit viewer (`page`) and run comparison
(`compare`). No JAX, no model: these read rollout records and metrics rows (docs/viewer.md)."""

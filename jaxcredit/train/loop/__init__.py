"""One training run's parts, in the order a run meets them: `run` (build the frozen Run; the step cadence and
stopping), `warm_start`, `rl_step` (sample, passes, credit, update, metrics), `async_rollouts`, `update` (the update's
batch, packed or not, and the PPO epochs), `step` (the jitted loss and update, `LOSS_TERMS`), `loss`, `heldout`
(evals), `export`, `checkpoint`, `metrics`."""

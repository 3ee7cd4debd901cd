"""The extension tables of the trainer: methods (`METHODS`), passes (`PASSES`) and their output classes, the
checks a row gets when a run is configured, rollout engines (`ENGINES`). Loss terms are `loop.step.LOSS_TERMS`."""

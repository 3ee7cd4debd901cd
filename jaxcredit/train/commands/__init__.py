"""What the CLI's commands run: `trainer` (`jaxcredit train` / `sft`), `evaluate` (`eval`), `offline_credit`
(`credit`), `plan` (`plan`), `report` (the viewer's credit of every requested method, `viz`)."""

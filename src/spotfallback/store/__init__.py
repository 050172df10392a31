"""Storage shell: where a run lives, the run ledger, the driver lease and checkpoints, on any pyarrow filesystem."""

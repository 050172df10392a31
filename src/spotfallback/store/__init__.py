"""Storage shell: where a run lives, its ledger, driver lease, progress heartbeat and checkpoints, on any pyarrow filesystem, all behind one retry rule."""

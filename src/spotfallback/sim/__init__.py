"""Simulation shell: the same policy driven over spot traces, the cost model and the planner."""

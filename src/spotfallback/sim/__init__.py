"""Simulation shell: the same policy driven over spot traces, the cost model and the planner.

The public entry points, one import away: ``simulate`` and ``simulate_many`` (Monte Carlo of
a ladder), ``backtest`` (a fixed ladder on every window of recorded traces) and
``hindsight_optimum`` (on ``Markets.of(ladder, world)``) / ``optimum_for`` (the least a job could
have spent on a trace).
"""

from spotfallback.sim.backtesting import BacktestResult, backtest
from spotfallback.sim.optimum import Markets, Optimum, hindsight_optimum, optimum_for
from spotfallback.sim.simulate import simulate, simulate_many

__all__ = ["BacktestResult", "Markets", "Optimum", "backtest", "hindsight_optimum", "optimum_for", "simulate", "simulate_many"]

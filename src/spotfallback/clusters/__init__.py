"""Ladders across Ray clusters: the run moved between clusters through each one's Ray Jobs API."""

from spotfallback.clusters.mover import ClusterMover, MoveOutcome, run_across_clusters

__all__ = ["ClusterMover", "MoveOutcome", "run_across_clusters"]

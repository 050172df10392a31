"""`spotfallback look-capacity`: a tier's capacity on the cluster it runs on, for a climb back across clusters.

Not a command for people (hidden from ``--help``): the driver that moves a run between Ray
clusters submits it as a Ray job to a higher tier's cluster while the run is on another one,
and reads the one line it prints (``clusters/looks.py``).
"""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from spotfallback.cli.common import fail, join_ray
from spotfallback.clusters.looks import DEFAULT_LOOK_WAIT_S, look_result
from spotfallback.config import MAX_DURATION_S, Tier, format_validation_error


def register(app: typer.Typer) -> None:
    """Add the hidden `look-capacity` to the spotfallback CLI."""

    @app.command("look-capacity", hidden=True)
    def look_cmd(
        tier_json: Annotated[str, typer.Option("--tier-json", help="The tier, as JSON (a job file's tier).")],
        requester: Annotated[str, typer.Option("--requester", help="Requester id of the autoscaler request.")],
        wait_s: Annotated[float, typer.Option("--wait-s", min=0, max=MAX_DURATION_S,
                                              help="Longest wait for the autoscaler to bring the gang's nodes.")] = DEFAULT_LOOK_WAIT_S,
    ) -> None:
        """Print how many of the tier's workers this Ray cluster can place, asking its autoscaler first."""
        try:
            tier = Tier.model_validate_json(tier_json)
        except ValidationError as e:
            raise fail(f"--tier-json: {format_validation_error(e).replace(chr(10), '; ')}") from None
        import ray

        from spotfallback.runtime.probe import look_capacity

        if (why := join_ray("auto")) is not None:
            raise fail(f"no Ray cluster to look at here ({why}); run it as a Ray job on the "
                       "tier's cluster, as the driver that moves a run between clusters does")
        try:
            available = look_capacity(tier, requester, wait_s)
        finally:
            ray.shutdown()
        typer.echo(look_result(tier, available))

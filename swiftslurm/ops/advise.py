"""`python -m swiftslurm advise OVERRIDES`: every strategy's peak-memory estimate for the plan's model, cluster
and batch, best first (those that fit, fastest first; then the rest, least memory first), each with the
overrides that render it. Takes the same overrides as a run; plans and writes nothing. See docs/memory.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # holds conf/ and hydra_plugins/


def main(args: list[str]) -> int:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from swiftslurm.cli import mistakes as cli_errors
    from swiftslurm.cli.mistakes import to_config
    from swiftslurm.errors import SwiftSlurmError, report
    from swiftslurm.planning.config import open_dict_overrides, register_configs
    from swiftslurm.planning.memory_plan import advise_table

    if any(a in ("-h", "--help") for a in args):
        print(f"usage: python -m swiftslurm advise [KEY=VALUE ...]\n\n{__doc__}")
        return 0
    register_configs()
    if str(CHECKOUT) not in sys.path:  # the sweeper plugin named in conf/config.yaml lives beside conf/
        sys.path.append(str(CHECKOUT))
    try:
        with initialize_config_dir(config_dir=str(CHECKOUT / "conf"), version_base=None):
            cfg = compose("config", overrides=open_dict_overrides(args))
        print(advise_table(to_config(cfg)))
    except (HydraException, OmegaConfBaseException, OverflowError) as err:
        if (message := cli_errors.command_line_refusal(err, args)) is None:
            raise
        return report(message)
    except SwiftSlurmError as err:
        return report(err)
    return 0

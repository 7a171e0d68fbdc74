"""swiftslurm: fine-tune LLMs with ms-swift on SLURM — planned, submitted, resumable.

The login side (``__main__``, ``config``, ``plan``, ``render``, ``submit``) turns a Hydra config into a
frozen ``JobPlan`` and a run directory; the node side (``swiftslurm.node``) reads only ``plan.json``.
"""

__version__ = "0.1.0"

"""swiftslurm: fine-tune LLMs with ms-swift on SLURM — planned, submitted, resumable.

The tree follows a run, conf -> plan -> run dir -> submit -> node -> engine -> commit -> sync -> operate:

    __main__.py  dispatch: a subcommand, or compose -> plan -> dry run | submit (launch.py: the steps)
    errors.py    the error family and its one formatter
    planning/    the config schema, make_plan, validation, the memory planner, ms-swift's argument table
    plan.py      JobPlan: the contract between the login side and the nodes (plan.json)
    render.py    pure renderings of a plan: the ms-swift command line, job.sbatch
    slurm.py     the one seam for SLURM's command-line tools; slurm_env.py: where am I, on a node
    rundir/      every file of a run dir (layout) and how it is written and read (records, JSON, lease)
    submit/      writing the run dir, submitting it through submitit, the preflight command, what is printed
    sweep/       the Hydra sweeper and the end of a sweep
    node/        the wrapper on every node: the attempt, resume, watch, conclude, decide, requeue
    engines/     one adapter per engine, and what runs inside the training ranks
    ckpt/        committed checkpoints: the manifest written last, the resume point, quarantine, retention
    storage/     committed checkpoints in object storage
    preflight/   the pre-launch checks, gathered on every node
    ops/         operating runs: status, logs, cancel, resume, plots, the goodput ledger, the storage CLI
    cli/         help, generated docs, the command line's own mistakes

The node side (node/ and what it loads: plan, rundir, ckpt, engines, storage, preflight, slurm, slurm_env,
signals) never imports planning/, ops/, submit/, sweep/, cli/ or Hydra; the login side never imports node/
(tests/unit/test_layout.py).
"""

__version__ = "0.1.0"

"""swiftslurm's Hydra sweeper (conf/config.yaml: `override hydra/sweeper: swiftslurm`).

See swiftslurm/sweep/sweeper.py.
"""

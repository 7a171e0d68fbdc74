"""swiftslurm's Hydra sweeper (conf/config.yaml: `override hydra/sweeper: swiftslurm`); see swiftslurm/sweeper.py."""

"""`python -m swiftslurm -m ...`: the sweeper that plans every point once, and the end of a sweep."""

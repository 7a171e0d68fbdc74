"""The login side's submission: write the run dir, submit it through submitit (or sbatch), and say what happened."""

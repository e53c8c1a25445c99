"""The Table 3 grid: plan its runs and run them, fan them out over processes or SLURM, check the rows' health."""

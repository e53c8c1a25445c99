"""What a run is: the budgets and Table 3 rows, a run's folder on disk, its options and its outcome."""

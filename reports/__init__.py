"""Reports that mirror the paper: Table 3 side by side, figures, one index (`python -m reports`)."""

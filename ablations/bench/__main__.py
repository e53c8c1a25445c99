"""`python -m ablations.bench` (what `nox -s bench` runs): the benchmark of ablations/bench/measure.py."""

import sys

from ablations.bench.measure import main

sys.exit(main())

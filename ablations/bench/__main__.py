"""`python -m ablations.bench` (what `nox -s bench` runs): the CPU benchmark of ablations/bench/cpu/measure.py."""

import sys

from ablations.bench.cpu.measure import main

sys.exit(main())

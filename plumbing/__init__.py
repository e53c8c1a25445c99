"""The plumbing every package shares, below all of them: it imports nothing of model, invariants, ablations or reports
(tests/test_layering.py holds the rule).

    files.py       a file written whole or not at all, StorageError, a folder checked writable before any work
    provenance.py  the commit of the code that made a result, the machine it ran on
    stopping.py    Ctrl-C and SIGTERM ending a command cleanly, or a training step first
    cli.py         one-line command-line errors: the parser, counts and device checks
"""

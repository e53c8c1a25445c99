"""Entry points: `nox -s invariants` (the main job), `nox -s tests` (and its quick tier `nox -s tests_quick`),
`nox -s lint`, `nox -s ablations`, `nox -s curves`, `nox -s report`, `nox -s bench`, `nox -s tests_transformers5`,
and on one GPU `nox -s bench_gpu` and `nox -s gpu_check`."""

import logging
import os

import nox

nox.options.sessions = ["invariants", "tests"]
nox.options.reuse_existing_virtualenvs = True  # torch makes a venv expensive
# nox looks for uv at every session and, where there is none, says "uv binary not found." before using pip as asked.
logging.getLogger("nox").addFilter(lambda record: record.getMessage() != "uv binary not found.")
PYPROJECT = nox.project.load_toml("pyproject.toml")


# Libraries whose declared requirements reach far beyond their model code (JoeyNMT asks for tensorboard, pylint,
# datasets, an old protobuf; OpenNMT-py for torch<2.3 and spacy): installed without them, with what the model modules
# import (model/adapters/joeynmt.py, model/adapters/opennmt.py).
PEERS_NO_DEPS = [
    "joeynmt==2.3.0",
    "OpenNMT-py==3.5.1",
    "importlib_metadata==8.7.0",
    "zipp==4.1.2",
    "subword-nmt==0.3.8",
]


def _install(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.install("--no-deps", *PEERS_NO_DEPS)


def asks_for_hf(args: list[str]) -> bool:
    """Whether a model spec in the arguments (or $AIAYN_MODEL) names a HuggingFace model: hf-marian, hf-bart, hf:PATH."""
    return asks_for(("hf-", "hf:"), args)


def asks_for(prefixes: tuple[str, ...], args: list[str]) -> bool:
    """Whether a model spec in the arguments (or $AIAYN_MODEL) starts with one of these prefixes."""
    specs = [os.environ.get("AIAYN_MODEL", ""), *(part for arg in args for part in arg.split("="))]
    return any(spec.startswith(prefixes) for spec in specs)


@nox.session
def invariants(session: nox.Session) -> None:
    """Check the paper's invariants on a model: nox -s invariants -- --model SPEC (default: reference)."""
    # Only what the checks import (run from the checkout, the package needs no install); transformers for an hf spec.
    session.install(*nox.project.dependency_groups(PYPROJECT, "invariants"))
    if asks_for_hf(session.posargs):
        session.install(*PYPROJECT["project"]["optional-dependencies"]["hf"])
    if asks_for(("x-transformers",), session.posargs):
        session.install(*PYPROJECT["project"]["optional-dependencies"]["peers"])
    if asks_for(("joeynmt", "opennmt"), session.posargs):
        session.install("--no-deps", "pyyaml==6.0.4", "sentencepiece==0.2.3", *PEERS_NO_DEPS)
    session.run("python", "-m", "invariants", *session.posargs)


def xdist(args: list[str]) -> list[str]:
    """pytest-xdist's options for the tests sessions: a worker per core (at most 8), the tests that share a module
    fixture or are marked serial grouped onto one worker each (tests/conftest.py). Unless the arguments choose: their
    own -n/--numprocesses (with --dist loadgroup where they name no --dist), or -p no:xdist (all in one process)."""
    names = [arg.split("=")[0] for arg in args]
    if "no:xdist" in args or "-pno:xdist" in args:
        return []
    if any(name == "--numprocesses" or (name.startswith("-n") and not name.startswith("--")) for name in names):
        return [] if "--dist" in names else ["--dist", "loadgroup"]
    return ["--numprocesses", "auto", "--maxprocesses", "8", "--dist", "loadgroup"]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the harness's own test suite, all of it, spread over the cores by pytest-xdist (docs/testing.md).

    posargs go to pytest: nox -s tests -- -k attention -x; -n 1 or -p no:xdist to run it otherwise."""
    _install(session)
    session.run("pytest", *xdist(session.posargs), *(session.posargs or ["tests"]))


@nox.session(default=False)
def tests_quick(session: nox.Session) -> None:
    """The edit-test loop's tier, about a minute on 2 cores: every test not marked slow (posargs go to pytest)."""
    _install(session)
    session.run("pytest", *xdist(session.posargs), "-m", "not slow", *(session.posargs or ["tests"]))


# The HF adapters reach into transformers internals (Marian's sinusoid table, the KV cache); the hf extra pins 4.x.
HF_TESTS = [
    "tests/invariants/test_hf_adapters.py",
    "tests/invariants/test_hf_fsmt.py",
    "tests/model/test_registry.py",
    "tests/model/test_init.py",
]


@nox.session(default=False)
def tests_transformers5(session: nox.Session) -> None:
    """The HF adapters' tests on transformers 5, which the hf extra's 4.x pin leaves untested."""
    _install(session)
    session.install("transformers==5.17.0")
    session.run("pytest", *(session.posargs or HF_TESTS))


@nox.session(default=False)
def lint(session: nox.Session) -> None:
    """Check the formatting and the lint rules of pyproject.toml's [tool.ruff]; `nox -s lint -- --fix` applies both."""
    session.install("ruff==0.17.6")
    fix = "--fix" in session.posargs
    session.run("ruff", "format", *([] if fix else ["--check", "--diff"]), ".")
    session.run("ruff", "check", *(["--fix"] if fix else []), ".")


@nox.session(default=False)
def ablations(session: nox.Session) -> None:
    """Train and score Table 3 rows: nox -s ablations -- --budget smoke --rows all."""
    _install(session)
    session.run("python", "-m", "ablations", *session.posargs)


# tensorboard brings protobuf 7, against the old protobuf that JoeyNMT (a test peer) asks for: the curves get a venv of
# their own, and the test extra leaves tensorboard out (tests/ablations/test_curves.py skips its one test needing it).
@nox.session(default=False)
def curves(session: nox.Session) -> None:
    """The runs' metrics as TensorBoard curves: nox -s curves -- runs/cpu --follow, then tensorboard --logdir
    runs/cpu/tensorboard (the session's venv has it)."""
    session.install("-e", ".[curves]")
    session.run("python", "-m", "ablations.runs.curves", *(session.posargs or ["runs"]))


@nox.session(default=False)
def report(session: nox.Session) -> None:
    """Rebuild every report under reports/ from the results on disk, without training."""
    _install(session)
    session.run("python", "-m", "reports", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmark the training step and beam search beside HF MarianMT and CTranslate2, then profile them where the time
    goes; writes reports/bench.md and reports/profile.md."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "ablations.bench", *session.posargs)
    session.run("python", "-m", "ablations.bench.cpu.profiling")


# On a GPU machine, torch's CUDA build is the machine's own: a venv from pyproject.toml would install the CPU build of
# the pin over it. The GPU sessions run the machine's python3, which needs torch, transformers, sentencepiece, pytest.
@nox.session(default=False, venv_backend="none")
def bench_gpu(session: nox.Session) -> None:
    """Benchmark the training step and beam search on one GPU beside HF MarianMT and torch.nn: reports/bench-gpu.md."""
    session.run("python3", "-m", "ablations.bench.gpu", *(session.posargs or ["--device", "cuda"]), external=True)


@nox.session(default=False, venv_backend="none")
def gpu_check(session: nox.Session) -> None:
    """What one GPU must show in 8 minutes, with this machine's python3: nox -s gpu_check -- --data gpu-data --out DIR
    (first, on any machine: python -m ablations.bench.check --prepare gpu-data)."""
    session.run("python3", "-m", "ablations.bench.check", *session.posargs, external=True)

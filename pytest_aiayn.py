"""The paper's invariants as pytest tests, one per property: `pytest --transformer-spec SPEC`, or in a test file

    from pytest_aiayn import TransformerInvariants

    class TestMyTransformer(TransformerInvariants):
        spec = "model.py:make,N=2,d_model=64"   # a .py path is relative to this test file
        device = "cuda"                         # optional: where the model runs (default: --transformer-device, cpu)

A decoder-only language model (lm-reference, hf-llama, a factory taking an LMConfig: docs/decoder-only.md) gets one
test per decoder-only property instead, on the CPU. A pass passes; a fail fails with the measured error, the
tolerance and its reason, and the replay command; not applicable is a skip with its reason; an error (the check broke)
is an error. -k picks properties by name, and --hypothesis-profile NAME the settings (default: the suite's own, as in
`python -m invariants`).

A pytest11 entry point, so every pytest run in the environment loads it: it imports the harness only when one of the
two is used, and then from beside this file, since pytest puts the user's folders (and a model.py in them) first on
sys.path. It has a top-level name of its own, so an invariants/ of the user's never hides it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

HERE = Path(__file__).resolve().parent
OPTION = "--transformer-spec"
DEVICE_OPTION = "--transformer-device"


class TransformerInvariants:
    """Subclass it in a test file, naming the model as `spec`: a model spec string (a .py path in it is relative to the
    test file) or a factory config -> model. Tests of your own on the subclass run too."""

    spec: str | Callable[[Any], Any] = ""
    device: str = ""  # a torch device (cuda, cuda:1); empty: --transformer-device, else the CPU


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiayn", "the paper's invariants (aiayn-harness)")
    group.addoption(
        OPTION,
        metavar="SPEC",
        default=None,
        help="check the invariants of 'Attention Is All You Need' on this model spec, one test per property",
    )
    group.addoption(
        DEVICE_OPTION,
        metavar="DEVICE",
        default=None,
        help="torch device the model runs on in those checks, e.g. cuda (default: cpu); the checks stay on the CPU",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the suite's profiles before hypothesis's plugin loads --hypothesis-profile, when it names one of them
    that nothing has registered (a profile of the user's of that name is theirs)."""
    name = config.getoption("hypothesis_profile", None)
    if not name:
        return
    import hypothesis  # here, not at the top: only a run that names a profile imports it

    try:
        hypothesis.settings.get_profile(name)
    except hypothesis.errors.InvalidArgument:
        profiles = harness("invariants.profiles")
        if name in profiles.EXAMPLES:
            profiles.register()


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> pytest.Collector | None:
    """A TransformerInvariants subclass named like a test class: its own tests, then one per property."""
    if (
        isinstance(obj, type)
        and issubclass(obj, TransformerInvariants)
        and obj is not TransformerInvariants
        and getattr(obj, "__test__", True)
        and collector.istestclass(obj, name)
    ):
        return InvariantsClass.from_parent(collector, name=name)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --transformer-spec, one more item per property (first, so that -k then deselects among them too)."""
    text = config.getoption("transformer_spec")
    if text:
        node = SpecInvariants.from_parent(session, name=text, nodeid=text)
        items.extend(session.genitems(node))


class Target:
    """The model under test, shared by its items: the spec (or factory), whether it is a decoder-only language model
    (docs/decoder-only.md), and the Subject built on first use."""

    def __init__(self, model: Any, device: str, decoder_only: bool = False) -> None:
        self.model, self.device, self.decoder_only, self._subject, self._error = model, device, decoder_only, None, ""

    def subject(self) -> Any:
        """The invariants' Subject, built once; a model that cannot be built errs every item with the same line."""
        if self._subject is None and not self._error:
            try:
                kind = (
                    harness("invariants.lm.subject").LMSubject
                    if self.decoder_only
                    else harness("invariants.subject").Subject
                )
                self._subject = kind(self.model, self.device)
            except Exception as exc:  # a SpecError says what to fix in one line; anything else is named
                self._error = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        if self._error:
            pytest.fail(f"error: {self._error}", pytrace=False)
        return self._subject


def model_of(spec: Any, folder: Path, where: pytest.Collector, device: str = "") -> Target:
    """The model a spec (or factory) names, a relative .py path in it taken from folder, on `device` (else the
    --transformer-device option, else the CPU); a decoder-only one (a registered name, or a factory taking an
    LMConfig) gets the decoder-only properties. A bad spec or device, or a module of the user's holding one of the
    harness's names, is a one-line collection error."""
    chosen = device or where.config.getoption("transformer_device") or "cpu"
    try:
        lm = harness("model.lm.registry")
        target = str(harness("invariants.device").resolve(chosen, "device" if device else DEVICE_OPTION))
        if callable(spec):
            decoder_only = lm.takes_lm_config(spec)
        else:
            spec = beside(spec, folder)
            decoder_only = lm.is_decoder_only(spec)
            spec = (lm.parse_lm_spec if decoder_only else harness("model.registry").parse_spec)(spec)
        if decoder_only:
            harness("invariants.lm.subject").on_the_cpu(target, "device" if device else DEVICE_OPTION)
    except (ImportError, ValueError) as exc:  # ValueError: a SpecError, or a device torch cannot use
        raise where.CollectError(f"error: {exc}") from None
    return Target(spec, target, decoder_only)


def beside(spec: str, folder: Path) -> str:
    """The spec with a relative .py path in its target (`model.py:make,N=2`) made a path under folder."""
    target, variant, pairs = harness("model.registry").split_spec(spec)
    if not target.endswith(".py") or Path(target).is_absolute():
        return spec
    return f"{folder / target}" + (f":{variant}" if variant else "") + (f",{pairs}" if pairs else "")


def property_items(parent: pytest.Collector, model: Target) -> list[PropertyItem]:
    pool = (
        harness("invariants.lm.properties").LM_PROPERTIES
        if model.decoder_only
        else harness("invariants.suite").PROPERTIES
    )
    return [PropertyItem.from_parent(parent, name=prop.name, prop=prop, target=model) for prop in pool]


class InvariantsClass(pytest.Class):
    """A TransformerInvariants subclass: the tests defined on it, then one item per property of its `spec`."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        model = model_of(self.obj.spec, self.path.parent, self, self.obj.device)
        return [*super().collect(), *property_items(self, model)]


class SpecInvariants(pytest.Collector):
    """The model of --transformer-spec (a .py path in it relative to where pytest was started): one item per property."""

    def collect(self) -> list[PropertyItem]:
        return property_items(self, model_of(self.name, self.config.invocation_params.dir, self))


class PropertyItem(pytest.Item):
    """One property on one model. Setup runs it, so that an error verdict is reported as an error; the test judges it."""

    def __init__(self, *, prop: Any, target: Target, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prop, self.target, self.result = prop, target, None

    def setup(self) -> None:
        subject, engine = self.target.subject(), harness("invariants.engine")
        settings, profile, seed = hypothesis_settings(self.config)
        self.result = self.prop(subject, settings=settings, seed=seed, profile=profile)
        if self.result.verdict == engine.ERROR:
            pytest.fail(
                f"error: {self.name} broke on {subject.name}: {self.result.reason}\nreplay: {replay(self.result)}",
                pytrace=False,
            )

    def runtest(self) -> None:
        engine, report, r = harness("invariants.engine"), harness("invariants.report"), self.result
        if r.verdict == engine.NOT_APPLICABLE:
            pytest.skip(f"{r.name} not applicable: {r.reason}")
        if r.verdict == engine.FAIL:
            pytest.fail(
                f"worst error {report.number(r.worst_error)}, tolerance {report.bound(r)} ({r.tolerance_reason})\n"
                f"{r.reason}\n"
                f"checks: {r.description}\n"
                f"replay: {replay(r)}",
                pytrace=False,
            )

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Its name as pytest prints it: Class.property as for a method, the property alone under --transformer-spec."""
        owner = f"{self.parent.name}." if isinstance(self.parent, InvariantsClass) else ""
        return self.path, None, owner + self.name


def replay(result: Any) -> str:
    """The engine's replay command, as the console script: it runs from any folder, where python -m would take a
    model.py of the user's there for the harness's `model`."""
    return result.reproduce.replace("python -m invariants", "aiayn-invariants", 1)


def hypothesis_settings(config: pytest.Config) -> tuple[Any, str, int | None]:
    """(settings, the profile its replay command names, seed) from --hypothesis-profile and --hypothesis-seed: the
    suite's dev, ci and thorough as in the CLI, any other profile as registered; without one, the suite's default."""
    profiles = harness("invariants.profiles")
    name = config.getoption("hypothesis_profile", None) or profiles.default_name()
    seed = str(config.getoption("hypothesis_seed", None))
    seed = int(seed) if seed.isdigit() else None
    if name in profiles.EXAMPLES:
        return profiles.profile(name), name, seed
    import hypothesis  # here, not at the top: a run that uses no invariants never imports it for them

    settings = hypothesis.settings.get_profile(name)
    return settings, "ci" if settings.derandomize else "dev", seed


def own(name: str) -> None:
    """Import the harness's top-level package `name` from beside this file, whatever comes first on sys.path; a module
    of the user's imported under that name already is an ImportError saying what to do."""
    folder = HERE / name
    module = sys.modules.get(name)
    if module is not None:
        if Path(getattr(module, "__file__", None) or "").resolve().parent != folder:
            raise ImportError(
                f"{getattr(module, '__file__', None) or name} was imported as {name!r}, the name of the harness's own "
                f"package; name your model by its path (spec = 'model.py:make'), and do not import it as {name!r} "
                "in a pytest run that checks invariants"
            )
        return
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def harness(module: str) -> ModuleType:
    """A module of the harness ('invariants.engine'), its packages imported on first use (`plumbing` and `model` first:
    `invariants` imports them)."""
    own("plumbing")
    own("model")
    own("invariants")
    return importlib.import_module(module)

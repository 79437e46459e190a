"""RecBole 1.2.1's metric classes, loaded offline for the tests that compare against them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest


def load_recbole_metrics() -> ModuleType:
    """RecBole's ``recbole/evaluator/metrics.py`` (the installed 1.2.1), loaded offline.

    ``import recbole.evaluator.metrics`` runs ``recbole/utils/__init__.py``, which imports
    ``colorlog`` and ``tensorboard`` (not installed here), and ``metrics.py`` imports
    ``sklearn.metrics`` (used only by AUC, MAE and RMSE). The real files are loaded under
    stand-in ``recbole``, ``recbole.utils`` and ``recbole.evaluator`` packages (``recbole.utils``
    gets the real ``EvaluatorType`` from ``utils/enum_type.py``), with a stand-in ``sklearn`` only
    if it is missing, all inside ``patch.dict(sys.modules)``: nothing is left in ``sys.modules``.
    """
    spec = importlib.util.find_spec("recbole")
    if spec is None or spec.origin is None:
        pytest.skip("recbole is not installed (pip install --no-deps recbole==1.2.1)")
    root = Path(spec.origin).parent
    with mock.patch.dict(sys.modules):
        for name in [n for n in sys.modules if n == "recbole" or n.startswith("recbole.")]:
            del sys.modules[name]
        for name, folder in (
            ("recbole", root),
            ("recbole.utils", root / "utils"),
            ("recbole.evaluator", root / "evaluator"),
        ):
            package = ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
        sys.modules["recbole.utils"].EvaluatorType = importlib.import_module(
            "recbole.utils.enum_type"
        ).EvaluatorType
        if importlib.util.find_spec("sklearn") is None:
            sklearn_metrics = ModuleType("sklearn.metrics")
            for fn in ("auc", "mean_absolute_error", "mean_squared_error"):
                setattr(sklearn_metrics, fn, None)
            sys.modules["sklearn"] = ModuleType("sklearn")
            sys.modules["sklearn.metrics"] = sklearn_metrics
        module = importlib.import_module("recbole.evaluator.metrics")
    assert Path(module.__file__) == root / "evaluator" / "metrics.py"
    return module

"""``python -m benchmarks.report``: writes ``REPORT.md`` (see the package docstring)."""

from . import main

main()

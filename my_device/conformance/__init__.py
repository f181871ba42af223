"""The OpInfo conformance suite of mydev: what it runs, and how to run all of it.

- `manifest.py`: the one list of expected failures and skips, each with a reason,
  and the representative subset CI runs;
- `selection.py`: which OpInfos and dtypes a run covers (CI subset, full sweep,
  or the `--ops`/`--dtypes` of `python -m my_device.conformance`);
- `plugin.py`: the pytest plugin that records each test's outcome and fallback use;
- `__main__.py`: the crash-isolated full sweep with its JSON and Markdown report.

The tests themselves are `test/test_conformance.py`.
"""

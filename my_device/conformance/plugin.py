"""A pytest plugin that writes each OpInfo test's outcome and fallback use as JSON lines.

Loaded with `-p my_device.conformance.plugin`; it writes to the file named by
MYDEV_CONFORMANCE_RESULTS (and does nothing without it). One line per test:
{"nodeid", "test", "op", "dtype", "outcome", "message", "seconds", "fallbacks"}
where test is the generic test name ("test_forward"), op the OpInfo full_name,
outcome one of pass, fail, xfail, xpass, skip, and fallbacks the ops the copying
CPU fallback served during the test, with their call counts.

For test files that are not OpInfo suites (`--suite pytorch`, PyTorch's own test
files), three more variables apply, each doing nothing when unset:
- MYDEV_CONFORMANCE_NAMES=raw: record the instantiated test name as "test" with
  op and dtype None (no lookup in op_db, which such files may not even import),
  and give a failure whose exception was raised from another one a "cause", the
  first exception's message (torch.testing's "Comparing ... resulted in the
  unexpected exception above" says nothing of its own);
- MYDEV_CONFORMANCE_COLLECTED=path: write the node id of every collected test,
  one a line, once collection ends (with --collect-only too);
- MYDEV_CONFORMANCE_SELECT=path: keep only the tests whose node ids that file
  lists (one a line) and deselect the rest, so that a batch of thousands of
  tests needs no command line of thousands of arguments;
- MYDEV_CONFORMANCE_SEED=n: the seed PyTorch's test framework gives every test
  (its SEED, 1234), so that a test can be rerun on other random data.
"""
import json
import os
import re

import pytest

RESULTS_VAR = "MYDEV_CONFORMANCE_RESULTS"
NAMES_VAR = "MYDEV_CONFORMANCE_NAMES"
COLLECTED_VAR = "MYDEV_CONFORMANCE_COLLECTED"
SELECT_VAR = "MYDEV_CONFORMANCE_SELECT"
SEED_VAR = "MYDEV_CONFORMANCE_SEED"

_SUFFIX = re.compile(r"_(?:mydev|privateuse1)(?:_(?P<dtype>[a-z0-9]+))?$")
_formatted = None  # OpInfo formatted_name -> full_name, longest first


_MODES = ("_train_mode", "_eval_mode")  # the ModuleInfo suite's train/eval variants


def parse_test_name(name):
    """("test_forward", "nn.functional.relu", "float32") from an instantiated test's name.

    Tests of the ModuleInfo suite give ("test_forward_train_mode", "nn.BatchNorm2d", "float32"):
    the module's name stands where the OpInfo's would, and its train/eval variant stays in the test."""
    global _formatted
    if _formatted is None:
        from torch.testing._internal.common_methods_invocations import op_db
        from torch.testing._internal.common_modules import module_db

        names = [(op.formatted_name, op.full_name) for op in op_db]
        names += [(m.formatted_name, m.name) for m in module_db]
        _formatted = sorted(names, key=lambda p: -len(p[0]))
    name = name.split("[")[0]
    m = _SUFFIX.search(name)
    if not m:
        return name, None, None
    rest, dtype = name[:m.start()], m.group("dtype")
    mode = next((s for s in _MODES if rest.endswith(s)), "")
    rest = rest[:len(rest) - len(mode)]
    for formatted, full in _formatted:
        if rest.endswith("_" + formatted) and rest.startswith("test"):
            return rest[:-len(formatted) - 1] + mode, full, dtype
    return rest + mode, None, dtype


def _message(report):
    if report.longrepr is None:
        return ""
    if isinstance(report.longrepr, tuple):  # skips: (file, line, reason)
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip()[:2000]


def _cause(report):
    chain = getattr(report.longrepr, "chain", None)
    if not chain or len(chain) < 2 or chain[0][1] is None:
        return None
    return chain[0][1].message.strip()[:2000]


class _Recorder:
    def __init__(self, path, raw_names=False):
        self.path = path
        self.raw_names = raw_names
        self.fallbacks = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        import my_device

        with my_device.track_fallbacks() as fb:
            yield
        self.fallbacks[item.nodeid] = fb.counts()

    def pytest_runtest_logreport(self, report):
        outcome = None
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if hasattr(report, "wasxfail"):
                outcome = "xpass" if report.passed else "xfail"
            elif report.skipped:
                outcome = "skip"
            else:
                outcome = "pass" if report.passed else "fail"
        if outcome is None:
            return
        name = report.nodeid.split("::")[-1]
        test, op, dtype = (name.split("[")[0], None, None) if self.raw_names else parse_test_name(name)
        message = _message(report)
        if outcome == "fail" and "Unexpected success" in message:
            outcome = "xpass"
        record = {"nodeid": report.nodeid, "test": test, "op": op, "dtype": dtype, "outcome": outcome,
                  "message": message if outcome != "pass" else "", "seconds": round(report.duration, 3),
                  "fallbacks": self.fallbacks.pop(report.nodeid, {})}
        cause = _cause(report) if self.raw_names and outcome in ("fail", "xfail") else None
        if cause:
            record["cause"] = cause
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class _Selection:
    """Collection-time hooks of the runner of PyTorch's test files (see the module docstring)."""

    def __init__(self, select_path, collected_path):
        self.wanted = None
        if select_path:
            with open(select_path) as f:
                self.wanted = {line.strip() for line in f if line.strip()}
        self.collected_path = collected_path

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if self.wanted is None:
            return
        keep = [i for i in items if i.nodeid in self.wanted]
        drop = [i for i in items if i.nodeid not in self.wanted]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    def pytest_collection_finish(self, session):
        if self.collected_path:
            with open(self.collected_path, "w") as f:
                f.writelines(item.nodeid + "\n" for item in session.items)


def pytest_configure(config):
    if os.environ.get(SEED_VAR):
        # setUp seeds every generator from this module global; the framework
        # has no pytest option for it (only --seed under run_tests).
        from torch.testing._internal import common_utils
        common_utils.SEED = int(os.environ[SEED_VAR])
    path = os.environ.get(RESULTS_VAR)
    if path:
        config.pluginmanager.register(_Recorder(path, os.environ.get(NAMES_VAR) == "raw"),
                                      "mydev-conformance-recorder")
    select, collected = os.environ.get(SELECT_VAR), os.environ.get(COLLECTED_VAR)
    if select or collected:
        config.pluginmanager.register(_Selection(select, collected), "mydev-conformance-selection")

import os
import subprocess
import sys
import textwrap

import pytest

import my_device  # noqa: F401  (registers the device for every test module)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for settings read once per process, crashes, fork)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


@pytest.fixture
def python_subprocess():
    return run_python

"""Builds and runs the mydev runtime's standalone C++ tests.

The runtime (third_party/mydev_runtime) has no PyTorch dependency, so it is
tested on its own: tests/*_test.cpp are compiled together with src/*.cpp
and run in subprocesses, each with a controlled MYDEV_* environment, because
the runtime reads its environment once per process and some behaviours
(strict-mode faults, fork) need a process of their own.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1] / "third_party" / "mydev_runtime"
PASS_LINE = re.compile(r"^(\d+) passed, 0 failed$", re.MULTILINE)
GiB = 1 << 30


# Each test program and its sources in tests/, linked with src/*.cpp: runtime_test runs the tests of
# every tests/<concept>_test.cpp but graph_test's, which is a program of its own.
TESTS = RUNTIME / "tests"
TEST_PROGRAMS = {
    "runtime_test": sorted(p for p in TESTS.glob("*_test.cpp") if p.name != "graph_test.cpp"),
    "graph_test": [TESTS / "graph_test.cpp"],
}


@pytest.fixture(scope="module")
def runtime_binaries(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot build the mydev runtime tests")
    out = tmp_path_factory.mktemp("mydev_runtime")
    library_sources = sorted((RUNTIME / "src").glob("*.cpp"))
    sources = library_sources + [s for program in TEST_PROGRAMS.values() for s in program]
    flags = ["-std=c++17", "-O1", "-pthread", "-I", str(RUNTIME / "include")]
    # Compile translation units in parallel: this is most of the file's runtime.
    jobs = []
    for src in sources:
        obj = out / f"{src.parent.name}_{src.stem}.o"
        cmd = [gxx, *flags, "-c", str(src), "-o", str(obj)]
        jobs.append((src, obj, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)))
    for src, _, proc in jobs:
        _, err = proc.communicate()
        assert proc.returncode == 0, f"compiling {src.name} failed:\n{err}"
    objects = {src: str(obj) for src, obj, _ in jobs}
    library = [objects[src] for src in library_sources]
    binaries = {}
    for program, program_sources in TEST_PROGRAMS.items():
        binaries[program] = out / program
        link = subprocess.run(
            [gxx, "-pthread", *library, *(objects[s] for s in program_sources), "-o", str(binaries[program])],
            capture_output=True,
            text=True,
        )
        assert link.returncode == 0, f"linking {program} failed:\n{link.stderr}"
    return binaries


@pytest.fixture(scope="module")
def runtime_test(runtime_binaries):
    return runtime_binaries["runtime_test"]


def run(binary, *args, env=None, timeout=60):
    """Runs the test binary with no MYDEV_* variables except those in env."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MYDEV_")}
    full_env.update(env or {})
    return subprocess.run(
        [str(binary), *args], env=full_env, capture_output=True, text=True, timeout=timeout
    )


def assert_passed(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    match = PASS_LINE.search(result.stdout)
    assert match and int(match.group(1)) > 0, result.stdout


def test_runtime_suite(runtime_test):
    # 256M keeps the limit-sized allocations of the OOM test small even on a
    # machine with strict overcommit accounting.
    assert_passed(run(runtime_test, env={"MYDEV_MEMORY_LIMIT": "256M"}))


@pytest.mark.parametrize("env", [{}, {"MYDEV_LAUNCH_BLOCKING": "1"}, {"MYDEV_STRICT": "1"},
                                 {"MYDEV_COMPUTE_UNITS": "1"}],
                         ids=["default", "launch_blocking", "strict", "serial_replay"])
def test_graph_suite(runtime_binaries, env):
    """Stream capture and graphs (tests/graph_test.cpp), in each mode that changes how work runs."""
    assert_passed(run(runtime_binaries["graph_test"], env=env))


def test_runtime_suite_with_default_environment(runtime_test):
    assert_passed(run(runtime_test))


def test_runtime_suite_with_launch_blocking(runtime_test):
    # The suite checks what each mode promises (e.g. a failing launch returns
    # the failure itself only when blocking), and runs the blocking-only tests.
    assert_passed(run(runtime_test, env={"MYDEV_LAUNCH_BLOCKING": "1", "MYDEV_MEMORY_LIMIT": "256M"}))


def test_launch_blocking(runtime_test):
    assert_passed(run(runtime_test, "blocking", env={"MYDEV_LAUNCH_BLOCKING": "1"}))


def test_exit_drops_pending_work_without_hanging(runtime_test):
    # Work queued behind a 60 s delay, a stream waiting for an event that work
    # would record, and a 100 ms task in progress at exit.
    start = time.monotonic()
    result = run(runtime_test, "exit-pending", timeout=30)
    elapsed = time.monotonic() - start
    assert_passed(result)
    assert "dropped work ran" not in result.stdout
    assert "waiting work ran" not in result.stdout
    assert "dropped high-priority work ran" not in result.stdout
    assert "held-back work ran" not in result.stdout
    # An exit handler that runs after the runtime's own still gets work done (inline).
    assert "late work ran" in result.stdout
    assert "late work on a new stream ran" in result.stdout
    assert "late use ok" in result.stdout
    assert result.stderr == ""
    assert elapsed < 10, elapsed


def test_exit_gives_up_on_a_stuck_launch(runtime_test):
    start = time.monotonic()
    result = run(runtime_test, "exit-stuck", timeout=30)
    elapsed = time.monotonic() - start
    assert_passed(result)
    assert elapsed < 10, elapsed


@pytest.mark.parametrize("depth", ["1", "4"])
def test_launch_queue_depth(runtime_test, depth):
    # A full stream makes the next enqueue wait for its worker; work on its own
    # stream, work feeding another full stream's work, and a destroy never hang.
    assert_passed(run(runtime_test, "queue-depth", env={"MYDEV_LAUNCH_QUEUE_DEPTH": depth}))


def test_exit_releases_a_submitter_waiting_for_room(runtime_test):
    start = time.monotonic()
    result = run(runtime_test, "exit-full", env={"MYDEV_LAUNCH_QUEUE_DEPTH": "2"}, timeout=30)
    elapsed = time.monotonic() - start
    assert_passed(result)
    # Released by the runtime's exit handler; its work then runs inline, as
    # work enqueued after exit does. The queued work was dropped.
    assert "blocked submitter released: mydevSuccess" in result.stdout, result.stdout
    assert "blocked work ran" in result.stdout
    assert result.stderr == ""
    assert elapsed < 10, elapsed


def test_defaults(runtime_test):
    result = run(runtime_test, "env", "2", str(8 * GiB), "0")
    assert_passed(result)
    assert result.stderr == ""


def test_device_count_from_environment(runtime_test):
    result = run(runtime_test, "env", "3", str(8 * GiB), "0", env={"MYDEV_DEVICE_COUNT": "3"})
    assert_passed(result)
    assert result.stderr == ""


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1048576", 1 << 20),
        ("64k", 64 << 10),
        ("64K", 64 << 10),
        ("512MB", 512 << 20),
        ("512mb", 512 << 20),
        ("3G", 3 * GiB),
        ("2gB", 2 * GiB),
        ("1T", 1 << 40),
        ("100", 100),  # below one page: nothing fits
        ("4096B", 4096),
        (" 16M ", 16 << 20),
    ],
)
def test_memory_limit_suffixes(runtime_test, value, expected):
    result = run(runtime_test, "env", "2", str(expected), "0", env={"MYDEV_MEMORY_LIMIT": value})
    assert_passed(result)
    assert result.stderr == ""


@pytest.mark.parametrize(
    "var, value",
    [
        ("MYDEV_DEVICE_COUNT", "0"),
        ("MYDEV_DEVICE_COUNT", "-1"),
        ("MYDEV_DEVICE_COUNT", "two"),
        ("MYDEV_DEVICE_COUNT", "3x"),
        ("MYDEV_DEVICE_COUNT", "1000"),
        ("MYDEV_MEMORY_LIMIT", "banana"),
        ("MYDEV_MEMORY_LIMIT", "-5G"),
        ("MYDEV_MEMORY_LIMIT", "12Q"),
        ("MYDEV_MEMORY_LIMIT", "1.5G"),
        ("MYDEV_MEMORY_LIMIT", "0"),
        ("MYDEV_MEMORY_LIMIT", "99999999999T"),
        ("MYDEV_STRICT", "yes"),
        ("MYDEV_LAUNCH_BLOCKING", "2"),
        ("MYDEV_LAUNCH_QUEUE_DEPTH", "-1"),
        ("MYDEV_LAUNCH_QUEUE_DEPTH", "lots"),
        ("MYDEV_LAUNCH_QUEUE_DEPTH", "4k"),
    ],
)
def test_bad_values_fall_back_with_warning(runtime_test, var, value):
    result = run(runtime_test, "env", "2", str(8 * GiB), "0", env={var: value})
    assert_passed(result)
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1, result.stderr
    assert var in warnings[0] and value in warnings[0]


def test_strict_mode_allows_copies_and_launches(runtime_test):
    assert_passed(run(runtime_test, "strict", env={"MYDEV_STRICT": "1"}))


def test_strict_mode_with_launch_blocking(runtime_test):
    assert_passed(run(runtime_test, "strict", env={"MYDEV_STRICT": "1", "MYDEV_LAUNCH_BLOCKING": "1"}))


def test_runtime_suite_in_strict_mode(runtime_test):
    assert_passed(run(runtime_test, env={"MYDEV_STRICT": "1", "MYDEV_MEMORY_LIMIT": "256M"}))


def assert_strict_fault_report(result, printed, allocation, tail=" outside a runtime copy or kernel launch"):
    """The case aborted with strict mode's report for the address it printed after `printed`."""
    assert result.returncode == -signal.SIGABRT, (result.returncode, result.stdout, result.stderr)
    address = re.search(printed + r" address (0x[0-9a-f]+)", result.stdout)
    assert address, result.stdout
    expected = f"mydev strict mode: host code accessed device memory at {address.group(1)} ({allocation}){tail}"
    assert expected in result.stderr, result.stderr
    assert "without faulting" not in result.stdout


def test_strict_mode_host_access_aborts_with_report(runtime_test):
    result = run(runtime_test, "strict-fault", env={"MYDEV_STRICT": "1"})
    assert_strict_fault_report(result, "device 1", "mydev:1 allocation of 10000 bytes")


@pytest.mark.parametrize("which, size", [("same", 10000), ("other", 20000)])
def test_strict_mode_host_access_while_a_kernel_runs_aborts_with_report(runtime_test, which, size):
    # A launched function is provably running (spinning on a latch, using its
    # allocation through the kernel address) when the host reads a device
    # address: of that allocation, or of another. Launched functions no longer
    # open device memory for everyone, so the read is caught.
    result = run(runtime_test, "strict-fault-running", which, env={"MYDEV_STRICT": "1"})
    assert_strict_fault_report(result, "kernel running; device 1", f"mydev:1 allocation of {size} bytes")


def test_strict_mode_kernel_using_a_device_address_aborts_with_report(runtime_test):
    # Launched functions must go through mydevKernelAddress; dereferencing the
    # device address itself is reported like any host access.
    result = run(runtime_test, "strict-fault-kernel", env={"MYDEV_STRICT": "1"})
    assert_strict_fault_report(result, "device 0", "mydev:0 allocation of 3000 bytes", tail="")


@pytest.mark.parametrize("which, how", [
    ("device", "through its device address, after it was freed"),
    ("kernel", "through its kernel address: a kernel used it after it was freed"),
])
def test_strict_mode_use_after_free_aborts_with_report(runtime_test, which, how):
    # A freed allocation's two addresses stay reserved for a while, so a late
    # use faults and is named, whether by host code or by a kernel.
    result = run(runtime_test, "strict-fault-freed", which, env={"MYDEV_STRICT": "1"})
    assert result.returncode == -signal.SIGABRT, (result.returncode, result.stdout, result.stderr)
    address = re.search(rf"freed {which} address (0x[0-9a-f]+)", result.stdout)
    assert address, result.stdout
    expected = (f"mydev strict mode: freed device memory accessed at {address.group(1)} "
                f"(mydev:0 allocation of 6000 bytes) {how}")
    assert expected in result.stderr, result.stderr
    assert "without faulting" not in result.stdout


def test_strict_mode_leaves_other_segfaults_alone(runtime_test):
    result = run(runtime_test, "strict-other-segv", env={"MYDEV_STRICT": "1"})
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stdout, result.stderr)
    assert "mydev strict mode" not in result.stderr


def test_fork_poisoning(runtime_test):
    # Fresh process: fork before initialising (child may use the runtime),
    # then after (child gets mydevErrorInitializationError); the children
    # report through their exit status, which the program CHECKs.
    assert_passed(run(runtime_test, "fork"))

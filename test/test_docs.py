"""What the docs name exists: every file path in README.md, CONTRIBUTING.md, docs/ and bench/RESULTS.md
is in the tree, and every script or module they tell a reader to run answers --help."""
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "RESULTS.md",
        *sorted((ROOT / "docs").glob("*.md"))]
# Where a path written in the docs may be relative to: the repository, or the folder a page is about.
BASES = ["", "csrc/", "csrc/native/", "my_device/", "my_device/mydev/", "third_party/",
         "third_party/mydev_runtime/", "third_party/mydev_runtime/include/", "test/", "bench/", "docs/"]
# Files the docs name that are not this repository's: PyTorch's (its test files, which a user fetches;
# ATen and AOTInductor headers) and what a command writes (a report).
EXTERNAL_FIRST_PARTS = {"ATen", "aoti_runtime", "aoti_include", "nn", "torch", "aten", "c10", "pytorch",
                        "http:", "https:"}
EXTERNAL_FILES = {"report.json", "report.md", "cpp_prefix.h", "test_ops.py", "test_torch.py", "test_view_ops.py",
                  "test_unary_ufuncs.py", "test_binary_ufuncs.py", "test_reductions.py", "test_indexing.py",
                  # torchgen writes these at build time (build/generated/mydev_lazy/)
                  "LazyIr.h", "RegisterLazy.cpp"}
SOURCE_SUFFIX = re.compile(r"\.(py|md|cpp|h|yaml|toml|txt|json|sh)$")


def _tracked():
    """The names of the tracked files, and of the folders they are in."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [pathlib.PurePosixPath(p) for p in out.split()]
    return {p.name for p in paths}, {part for p in paths for part in p.parts[:-1]}


def _named_paths(text, dirs):
    for m in re.finditer(r"`([^`\s]+)`", text):
        token = m.group(1).rstrip(".,:;)").split("::")[0]
        if not re.fullmatch(r"[\w./*-]+", token) or token.startswith(("/", "~", ".")):
            continue
        if "/" in token:
            parts = token.rstrip("/").split("/")
            if parts[0] in EXTERNAL_FIRST_PARTS:
                continue
            # A path starts in one of the tree's folders or names a file; `set/get_x` is neither.
            if parts[0] in dirs or SOURCE_SUFFIX.search(parts[-1]):
                yield token
        elif SOURCE_SUFFIX.search(token) and not token.startswith("."):
            yield token


def test_every_path_the_docs_name_exists():
    tracked, dirs = _tracked()
    missing, checked = [], 0
    for doc in DOCS:
        for path in _named_paths(doc.read_text(), dirs):
            checked += 1
            if "/" not in path:
                if path not in tracked and path not in EXTERNAL_FILES:
                    missing.append((doc.name, path))
                continue
            if "*" in path:
                found = any(any(ROOT.glob(base + path)) for base in BASES)
            else:
                found = any((ROOT / (base + path)).exists() for base in BASES)
            if not found:
                missing.append((doc.name, path))
    assert not missing, missing
    assert checked > 300  # the docs name hundreds of files: a pattern that stopped matching shows here


def _commands():
    scripts, modules = set(), set()
    for doc in DOCS:
        text = doc.read_text()
        scripts.update(re.findall(r"python (bench/\w+\.py)", text))
        modules.update(m for m in re.findall(r"python -m (my_device[\w.]*)", text))
    return sorted(scripts), sorted(modules)


def test_every_command_the_docs_give_answers_help(python_subprocess):
    scripts, modules = _commands()
    assert "bench/bench_generate.py" in scripts and "my_device.conformance" in modules
    # One interpreter runs each with --help (each argparse exits 0), so torch is imported once.
    r = python_subprocess(f"""
        import runpy, sys
        sys.path.insert(0, "bench")
        failed = []
        for kind, target in [("path", s) for s in {scripts!r}] + [("module", m) for m in {modules!r}]:
            sys.argv = [target, "--help"]
            try:
                runpy.run_path(target, run_name="__main__") if kind == "path" else \\
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                failed.append((target, "no SystemExit: --help is not handled"))
            except SystemExit as e:
                if e.code not in (0, None):
                    failed.append((target, e.code))
        print("failed:", failed)
    """, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("failed: []"), r.stdout[-3000:]


def test_no_internal_issue_numbers():
    # A reader cannot look them up: the reasoning goes into the comment or doc itself.
    out = subprocess.run(["git", "grep", "-n", "-i", "-E", r"\bissues? ?#?[0-9]+", "--", ":!*.json"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    assert out == "", out

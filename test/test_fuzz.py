"""The fuzzer (python -m my_device.conformance.fuzz): a short run through each fast frontend, and that it tells
a wrong value, a refusal and an agreeing mutant apart. Longer runs are a separate command (docs/fuzzing.md)."""
import json
import sys

import pytest
import torch

from my_device.conformance import fuzz, manifest
from my_device.conformance import program_text as pt
from my_device.conformance import random_programs as rp

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.trace
OPS = rp.pool(manifest.CI_OPS)


def test_programs_are_made_again_from_their_seed_and_chain_steps():
    a, b = rp.make(3, OPS, 5), rp.make(3, OPS, 5)
    assert a.describe() == b.describe()
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    # Across a few seeds, some step reads a value an earlier step made (not only the program's inputs).
    programs = [rp.make(s, OPS, 5) for s in range(6)]
    assert any(f"v{len(p.inputs) + k}" in line for p in programs
               for k, line in enumerate(p.describe().splitlines()[2:]))


@pytest.mark.parametrize("frontend", ["eager", "compile", "lazy", "jit"])
def test_random_programs_agree_with_the_cpu(frontend):
    for seed in range(3):
        program = rp.make(seed, OPS, 4)
        outcome, detail = fuzz._run_program(program, frontend)
        assert outcome in ("pass", "rejected"), f"{program.describe()}\n{detail}"


def test_a_wrong_value_is_reported(monkeypatch):
    program = rp.make(0, OPS, 4)
    off_by_one = lambda p: (lambda *xs: tuple(o + 1 for o in p(*xs)))  # noqa: E731
    monkeypatch.setattr(fuzz, "_through", lambda frontend: off_by_one)
    assert fuzz._run_program(program, "eager")[0] == "wrong"


def test_mutants_are_refused_or_agree_with_the_text_run_op_by_op():
    text = ("program p\ninput %0 : Float[4,3]{3,1}+0\n%1 = aten::mul.Scalar(%0, f2.0) : Float[4,3]{3,1}+0\n"
            "%2 = aten::t(%1) : Float[3,4]{1,3}+0\n%3 = aten::sum.dim_IntList(%2, [i1], b0, n) : Float[3]{1}+0\n"
            "output %3 %2\n")
    assert fuzz._run_mutant(text, 0) == ("ran", "")
    assert fuzz._run_mutant(text.replace("Float[3]{1}", "Float[4]{1}"), 0)[0] == "refused"
    with pytest.raises(AssertionError):
        pt.compare([torch.ones(3)], [torch.zeros(3)], rtol=0, atol=0)
    # What a program leaves unwritten (NaN in the reference) is not compared.
    pt.compare([torch.ones(2)], [torch.tensor([1.0, float("nan")])], rtol=0, atol=0)


def test_a_short_run_under_strict_mode_finds_nothing(tmp_path, python_subprocess):
    # The crash-isolated command itself: workers under MYDEV_STRICT=1, mutants of every compiled text.
    result = python_subprocess(
        "import sys; from my_device.conformance.fuzz import main; sys.exit(main(sys.argv[1:]))",
        args=["--programs", "3", "--seed", "20", "--frontends", "compile,lazy", "--mutations", "40",
              "--ops", ",".join(manifest.CI_OPS), "--out", str(tmp_path)], timeout=600)
    report = json.loads((tmp_path / "report.json").read_text())
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert report["findings"] == []
    assert sum(report["outcomes"]["mutants"].values()) >= 100
    assert report["outcomes"]["mutants"].get("refused", 0) > 0 and report["outcomes"]["mutants"].get("ran", 0) > 0

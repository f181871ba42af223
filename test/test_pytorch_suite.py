"""python -m my_device.conformance --suite pytorch: pairing CPU and mydev results of a
device-generic test file, crash isolation, the report's figures and groups."""
import json
import subprocess
import sys
import textwrap

import pytest

from my_device.conformance import pytorch_suite as ps

# A device-generic test file in the manner of PyTorch's own: one class that is not
# device-generic (left out), two that are (the first one a process instantiates is
# named ...PRIVATEUSE1, the next ...MYDEV), and tests that pass, fail, skip, abort
# or cannot run on mydev.
FAKE = textwrap.dedent('''
    import os
    import torch
    from torch.testing._internal.common_utils import TestCase, run_tests
    from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests, onlyCPU


    class TestPlain(TestCase):
        def test_plain(self):
            pass


    class TestFake(TestCase):
        def test_add(self, device):
            self.assertEqual(torch.ones(2, device=device) + 1, torch.full((2,), 2.0, device=device))

        @dtypes(torch.float32, torch.int64)
        def test_kernel(self, device, dtype):
            if self.device_type != "cpu":
                raise RuntimeError(f"no kernel at {hex(id(self))} for a tensor of shape [{id(self) % 7}, 4]")

        @onlyCPU
        def test_cpu_only(self, device):
            pass

        def test_feature(self, device):
            if self.device_type != "cpu":
                self.skipTest("needs a feature mydev lacks")

        def test_abort(self, device):
            if self.device_type != "cpu":
                os.abort()

        def test_tolerance(self, device):
            # the CPU's draw under the framework's seed passes, mydev's and the CPU's under seed 1 do not
            self.assertEqual(torch.rand(1, device=device).item(), 0.0, atol=0.5, rtol=0)

        def test_wrong_value(self, device):
            self.assertEqual(torch.ones(2, device=device) * (2 if self.device_type != "cpu" else 1), torch.ones(2, device=device))

        def test_everywhere(self, device):
            raise AssertionError("fails on every device")


    class TestSecond(TestCase):
        def test_sub(self, device):
            self.assertEqual((torch.ones(3, device=device) - 1).sum().item(), 0.0)


    instantiate_device_type_tests(TestFake, globals())
    instantiate_device_type_tests(TestSecond, globals())

    if __name__ == "__main__":
        run_tests()
''')


def test_names_lose_their_device_part():
    assert ps.generic_test("test_foo_cpu_float32", "cpu") == "test_foo_float32"
    # the last "_mydev" is the device; one inside the test's own name stays
    assert ps.generic_test("test_cpu_to_mydev_copy_mydev_int64_float32", "mydev") == \
        "test_cpu_to_mydev_copy_int64_float32"
    assert ps.generic_test("test_bar_cpu", "cpu") == "test_bar"
    assert ps.generic_class("TestFooPRIVATEUSE1", "mydev") == ps.generic_class("TestFooMYDEV", "mydev") == "TestFoo"
    assert ps.test_id("a/b.py::TestFooCPU::test_x_cpu_bool", "cpu") == ps.test_id(
        "a/b.py::TestFooMYDEV::test_x_mydev_bool", "mydev") == "a/b.py::TestFoo::test_x_bool"
    assert ps.normalise("RuntimeError: bad at 0x7f3a12 for [3, 4] in float32\nmore") == \
        "RuntimeError: bad at 0x… for [N, N] in float32"
    assert ps.normalise("RuntimeError: copy_() of torch.HalfTensor to torch.sparse.HalfTensor, CPUHalfType") == \
        ps.normalise("RuntimeError: copy_() of torch.FloatTensor to torch.sparse.FloatTensor, CPUFloatType")
    assert ps.normalise("\"add\" not implemented for 'BFloat16' (torch.bfloat16)") == \
        "\"add\" not implemented for '<dtype>' (torch.<dtype>)"


def test_dtype_slices():
    ids = ["f.py::TestOpsCPU::test_out_add_cpu_float32", "f.py::TestOpsCPU::test_out_add_cpu_int64",
           "f.py::TestOpsCPU::test_dtypes_add_cpu", "f.py::TestOpsCPU::test_dtypes_float32_view_cpu_bool"]
    assert ps.of_dtypes(ids, "cpu", "float32") == ids[:1]
    assert ps.of_dtypes(ids, "cpu", "int64, bool") == [ids[1], ids[3]]
    assert ps.of_dtypes(ids, "cpu", "none") == [ids[2]]
    assert ps.of_dtypes([i.replace("cpu", "mydev") for i in ids], "mydev", "none,float32") == \
        [ids[0].replace("cpu", "mydev"), ids[2].replace("cpu", "mydev")]


def test_baseline_comparison_by_test_id():
    old = [{"id": "a", "mydev": "pass"}, {"id": "b", "mydev": "fail"}, {"id": "c", "mydev": "skip"},
           {"id": "d", "mydev": "pass"}]
    new = [{"id": "a", "mydev": "fail"}, {"id": "b", "mydev": "pass"}, {"id": "c", "mydev": "crash"}]
    regressions, improvements = ps.compare(new, old)
    assert regressions == [("a", "pass", "fail"), ("c", "skip", "crash")]  # d was not run: not compared
    assert improvements == [("b", "fail", "pass")]


@pytest.mark.slow
def test_a_device_generic_file_end_to_end(tmp_path):
    tests = tmp_path / "pytorch" / "test"
    tests.mkdir(parents=True)
    (tests / "test_fake.py").write_text(FAKE)
    out = tmp_path / "report"
    r = subprocess.run([sys.executable, "-m", "my_device.conformance", "--suite", "pytorch", "--pytorch-tests",
                        str(tests), "--files", "test_fake.py,test_missing.py", "--out", str(out), "--seed-tries", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((out / "report.json").read_text())
    f = data["files"]["test_fake.py"]
    assert "no file test_missing.py" in data["files"]["test_missing.py"]["error"]
    rows = {x["id"].removeprefix("test_fake.py::"): x for x in data["results"]}
    assert rows["TestSecond::test_sub"]["category"] == "both-pass"  # TestSecondCPU <-> TestSecondMYDEV
    assert rows["TestFake::test_add"]["category"] == "both-pass"  # TestFakeCPU <-> TestFakePRIVATEUSE1
    assert rows["TestFake::test_abort"]["mydev"] == "crash" and rows["TestFake::test_abort"]["cpu"] == "pass"
    assert rows["TestFake::test_cpu_only"]["category"] == "impossible"
    assert rows["TestFake::test_everywhere"]["category"] == "cpu-not-passing"
    assert not any("TestPlain" in k for k in rows)
    # the CPU passes 9 (add, kernel x2, cpu_only, feature, abort, sub, tolerance, wrong_value); mydev 2 of them;
    # 1 cannot pass; the CPU fails tolerance too under seed 1 (mydev's generator draws other numbers), while
    # wrong_value, a mismatch the CPU never shows, stays mydev's
    assert (f["cpu_passes"], f["mydev_passes_of_cpu_passes"], f["impossible"]) == (9, 2, 1)
    assert rows["TestFake::test_tolerance"]["category"] == "cpu-shares"
    assert "seed set to 1: " in rows["TestFake::test_tolerance"]["reason"]
    assert f["cpu_shares_on_other_data"] == 1 and rows["TestFake::test_wrong_value"]["category"] == "mydev-fail"
    assert (f["percent"], f["percent_excluding_impossible"]) == (22.22, 28.57)
    assert (f["mydev_only_failures"], f["mydev_only_skips"], f["crashes"], f["not_device_generic"]) == (4, 1, 1, 1)
    groups = {g["key"]: g["count"] for g in f["failure_groups"]}
    assert groups.pop("RuntimeError: no kernel at 0x… for a tensor of shape [N, N]") == 2
    assert groups.pop("AssertionError: Tensor-likes are not close!") == 1
    assert [k.startswith("[crash] killed by SIGABRT") for k in groups] == [True], groups
    assert [(g["key"], g["count"]) for g in f["skip_groups"]] == [("needs a feature mydev lacks", 1)]
    assert f["impossible_groups"][0]["key"].startswith("@onlyCPU")
    md = (out / "report.md").read_text()
    assert "| test_fake.py | 9 | 2 | 22.22 | 1 | 1 | 28.57 | 4 | 1 | 1 |" in md
    assert "test_missing.py | not run" in md

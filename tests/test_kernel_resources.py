"""benchmarks/kernel_resources.py --waits reads the order of a loop's tensor-core products
and waits out of Triton's compiled IR; lesson 7 reads that order from the committed
report. The reader is checked here on IR written by hand, nested loops included."""
import pytest

from tests.bench_scripts import load

pytest.importorskip("triton")
KR = load("kernel_resources")

# the shape of Triton's TritonGPU IR for sm90: an outer loop over query heads holding a
# loop that only loads, then the loop with the products
IR = """
    %dv:2 = scf.for %g = %c0_i32 to %GROUP step %c1_i32 iter_args(%dk = %cst_2) -> (...) : i32 {
      %w = scf.for %j = %c0_i32 to %n step %c1_i32 iter_args(%x = %c0) -> (i32) : i32 {
        %y = arith.addi %x, %j : i32
        scf.yield %y : i32
      } {tt.num_stages = 1 : i32}
      %r:2 = scf.for %i = %c0_i32 to %nq step %c64_i32 iter_args(%dk_1 = %dk, %dv_1 = %dv) -> (...) : i32 {
        %sT_1 = ttng.warp_group_dot %k_30, %qT_152, %cst_0 {inputPrecision = 0 : i32, isAsync = true} : a * b -> c
        %sT_2:3 = ttng.warp_group_dot_wait %sT_1, %k_30, %qT_152 {pendings = 0 : i32} : a, b, c
        %dv_164 = ttng.warp_group_dot %pT_163, %do_154, %dv_1 {inputPrecision = 0 : i32, isAsync = true} : a * b -> c
        %dpT_1 = ttng.warp_group_dot %v_46, %dpT, %cst_0 {inputPrecision = 0 : i32, isAsync = true} : a * b -> c
        %dpT_2:3 = ttng.warp_group_dot_wait %dpT_1, %v_46, %dpT {pendings = 1 : i32} : a, b, c
        scf.yield %dv_164, %dk_1 : ...
      } {tt.num_stages = 2 : i32}
      %done:2 = ttng.warp_group_dot_wait %r#1, %r#0 {pendings = 0 : i32} : a, b
      scf.yield %done#0 : ...
    }
"""


def test_reads_the_innermost_loop_with_products_in_order():
    assert KR._loop_products(IR) == [("dot", "sT", False), ("wait", 0), ("dot", "dv", True),
                                     ("dot", "dpT", False), ("wait", 1)]


def test_no_loop_with_products_gives_nothing():
    without = "\n".join(line for line in IR.splitlines() if "warp_group_dot" not in line)
    assert KR._loop_products(without) == []

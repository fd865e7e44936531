"""The toy register machine of lessons 1 and 2.

* the **matmul machine** has a multiply-accumulate unit:
  ``LOAD src, Rd`` / ``STORE Rs, dst`` / ``MAC_Z Ra, Rb, Rd`` (Rd = Ra*Rb) /
  ``MAC Ra, Rb, Rc, Rd`` (Rd = Ra*Rb + Rc);
* the **softmax machine** has an ALU: ``MAX/SUB/ADD/MUL/DIV Ra, Rb, Rd``
  (Rd = Ra op Rb), ``EXP Ra, Rd`` and ``MOV Rs, Rd``, plus LOAD and STORE.

The package is split by job:

* :mod:`.isa` - every instruction in one table (operands, syntax, what it computes);
* :mod:`.interpreter` - :func:`run_trace` and the DRAM layouts;
* :mod:`.traces` - the softmax traces of lesson 2 and their DRAM traffic;
* :mod:`.checks` - :func:`check_trace`, the lesson checks against the best known costs;
* :mod:`.schedules` - :func:`matmul_schedule`, traces for an n x n matmul with R registers.

Everything is importable from ``course_utils.machine`` as before.
"""
from .isa import INSTRUCTIONS, ISAS, Instruction, instruction_table
from .interpreter import (_SYNTAX, Step, TraceError, TraceResult, matmul_dram, run_trace,
                          softmax_dram)
from .traces import (ONLINE_INIT, _online_step, naive_softmax_trace, online_softmax_trace,
                     plot_softmax_traffic, safe_softmax_trace, softmax_traffic)
from .checks import PROBLEMS, Problem, check_trace
from .schedules import MatmulSchedule, matmul_loads, matmul_schedule, plot_loads_vs_registers

__all__ = [
    "ISAS", "INSTRUCTIONS", "Instruction", "instruction_table",
    "TraceError", "Step", "TraceResult", "run_trace", "matmul_dram", "softmax_dram",
    "safe_softmax_trace", "online_softmax_trace", "naive_softmax_trace", "ONLINE_INIT",
    "PROBLEMS", "Problem", "check_trace", "MatmulSchedule", "matmul_schedule", "matmul_loads",
    "plot_loads_vs_registers", "plot_softmax_traffic", "softmax_traffic",
]

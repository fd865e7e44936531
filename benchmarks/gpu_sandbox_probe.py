"""Does a graded kernel's sandbox still see the GPU? Runs a tiny CUDA probe under each
isolation level and memory bound the grader offers and prints what the probe saw:

    python benchmarks/gpu_sandbox_probe.py
"""
import tempfile
from pathlib import Path

from course_utils.grading import sandbox

PROBE = ("import os, torch\n"
         "print('uid', os.getuid())\n"
         "try:\n"
         "    torch.cuda.init(); print('cuda ok', torch.cuda.get_device_name())\n"
         "    from course_utils import device; print('course_utils', device.DEVICE)\n"
         "except Exception as e:\n"
         "    print('cuda FAILED:', type(e).__name__, str(e)[:300])\n")

ll = sandbox.sandbox_exec.landlock_abi()
ns = sandbox._namespaces_work()
cases = [("namespaces+landlock", sandbox.Isolation(ns, ll)), ("namespaces", sandbox.Isolation(ns, 0)),
         ("landlock", sandbox.Isolation(False, ll)), ("limits", sandbox.Isolation(False, 0))]
for name, iso in cases:
    for mem in (8192, 0):
        with tempfile.TemporaryDirectory() as d:
            box = sandbox.Sandbox(Path(d) / "scratch", [], iso, memory_mb=mem)
            job = Path(d) / "job"
            job.mkdir()
            log = job / "log.txt"
            ok = box.run(job, ["-c", PROBE], job, log, wall=120)
            print(f"{name:22s} memory_mb={mem:<5d} finished={ok}: {log.read_text().strip()[-700:]}")

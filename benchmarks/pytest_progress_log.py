"""A pytest plugin for runs that a time limit may cut short: each test's outcome is
appended to ``$PROGRESS_LOG`` as it is reported (failures with their traceback), so a
killed run still says what passed and what failed. ``-p benchmarks.pytest_progress_log``."""
import os


def pytest_runtest_logreport(report):
    path = os.environ.get("PROGRESS_LOG")
    # under pytest-xdist the controller sees every worker's reports: log there only; one
    # line a test (its call), plus set-up or tear-down where they fail or skip it
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return
    with open(path, "a") as f:
        f.write(f"{report.outcome.upper()} {report.nodeid} ({report.when}, "
                f"{report.duration:.1f} s)\n")
        if report.failed:
            f.write(report.longreprtext[-4000:] + "\n\n")

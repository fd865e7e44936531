import importlib
import pkgutil
import sys

import course_utils.bench as pkg

SUITES = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)
                if m.name not in ("common", "__main__"))


def main(argv):
    if not argv or argv[0] not in SUITES:
        print(f"usage: python -m course_utils.bench {{{','.join(SUITES)}}} [options]")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    return importlib.import_module(f"course_utils.bench.{argv[0]}").main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m course_utils doctor``: print the environment report."""
import sys


def main(argv):
    if argv[:1] == ["doctor"]:
        from .doctor import doctor
        return 0 if doctor() else 1
    print("usage: python -m course_utils doctor")
    return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

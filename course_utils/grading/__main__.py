import sys

from course_utils.grading.cli import main

sys.exit(main())

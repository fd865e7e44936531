"""Classroom grading that students cannot game: ``course-grade`` and its API.

    from course_utils.grading import grade
    result = grade("01_register_machine", "submissions/", "grades/", workers=2)
    result.scores()        # {"alice": 5, "bob": 3, ...}

See :mod:`course_utils.grading.grader` for the grading model and
``python -m course_utils.grading --help`` for the command line.

The names below are loaded on first use, so that a graded kernel importing
:mod:`course_utils.grading.kernel_side` does not pay for the grader itself.
"""
__all__ = ["grade", "load_template", "prepare_reference", "feedback_text",
           "ClassResult", "Template", "GradingError", "TemplateError"]


def __getattr__(name):
    if name == "TemplateError":
        from course_utils.grading.instrument import TemplateError
        return TemplateError
    if name in __all__:
        from course_utils.grading import grader
        return getattr(grader, name)
    raise AttributeError(f"module 'course_utils.grading' has no attribute {name!r}")

"""Interactive views (ipywidgets) used by the lessons.

Every view is a plain-Python object that can be stepped without a browser
(``step()``, ``goto(i)``, ``state()``), builds its ipywidgets UI with
``widget()``, and draws a static filmstrip with ``filmstrip()`` (a matplotlib
Figure) for readers without a kernel. Notebooks display a view with
:func:`show`, which picks the live widget normally and the filmstrip when the
course is rendered as a static site (``COURSE_STATIC_WIDGETS=1``).
"""
from __future__ import annotations

import os

__all__ = ["static_mode", "show"]


def static_mode() -> bool:
    """True when rendering for readers without a kernel (the static site)."""
    return os.environ.get("COURSE_STATIC_WIDGETS") == "1"


def show(view):
    """Display ``view``: its live widget, or its filmstrip in static mode."""
    from IPython.display import display
    if static_mode():
        fig = view.filmstrip()
        display(fig)
        import matplotlib.pyplot as plt
        plt.close(fig)
        return None
    w = view.widget()
    display(w)
    return w

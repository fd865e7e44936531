"""Write the instructors' table: ``python -m tests.wrong_answers``."""
from tests.wrong_answers import TABLE, table_markdown

TABLE.parent.mkdir(exist_ok=True)
TABLE.write_text(table_markdown(), encoding="utf-8")
print(f"wrote {TABLE}")

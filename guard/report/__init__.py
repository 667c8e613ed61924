"""The report stage: the results record and its schema, and how it reads (terminal, Markdown)."""

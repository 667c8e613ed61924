"""The data model every stage shares, below them all: a run's record and its environment
(``environment``), the checks, reasons and results judged from it (``results``), and the schema
results.json is checked against. It imports no stage; every stage imports it."""

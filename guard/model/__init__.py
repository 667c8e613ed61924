"""The data model every stage shares, below them all: a run's record and its environment
(``environment``), the checks, reasons and results judged from it (``records``) and the one
roll-up to a verdict (``verdict``), and results.json, their file form (``jsonfiles``, checked
against ``schema``). It imports no stage; every stage imports it."""

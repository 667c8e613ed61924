"""The judge stage: statistics, decision rules and the one roll-up of a run record to a verdict."""

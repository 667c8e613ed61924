"""The config stage: budgets (the only YAML reader), their surgical edits, the model weights' pinned revision."""

"""The github stage: publishing a verdict (checks, comments), who may trigger a run, what is safe to echo."""

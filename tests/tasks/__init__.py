"""The Celery glue with embedded workers: RedlockTask, options, keys, queue once, beat."""

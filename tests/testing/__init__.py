"""The test kit, celery_redlock.testing."""

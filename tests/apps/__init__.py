"""What the tests run in processes of their own: the Celery apps of ``celery -A
tests.apps.<name>`` workers, beats and CLI calls, the Django project and the green-pool
rounds script. Importable from the checkout (``PYTHONPATH`` = the checkout)."""

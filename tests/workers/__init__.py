"""Real ``celery worker`` subprocesses: pools, redelivery, hand-off, RabbitMQ, Django beat."""

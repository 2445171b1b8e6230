"""A Django app whose one task, ``ticks.count``, the database schedule runs."""

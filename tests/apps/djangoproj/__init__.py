"""A tiny Django project for test_django_beat: django-celery-beat's database schedule
with the Redlock mixin, and a RedlockTask in a Django app (the Django guide's
recipe, docs/guides/django.md)."""

from .celery import app as celery_app

__all__ = ["celery_app"]

"""Plain helpers the tests import (no fixtures: those live in conftest.py files)."""

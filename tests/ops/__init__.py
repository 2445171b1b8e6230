"""What operators and maintainers run: the CLI, metrics, the demo, benchmarks, the layout."""

"""What a person at the terminal sees: result lines and notes (output.py, the one module that prints)
and plain tables (tables.py). A low floor of `infra`: the commands, the demo and the benchmarks
use it; it imports nothing of the project."""

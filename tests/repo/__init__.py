"""Tests of the repository: README and CI in step, the deps tool, the import graph, script loader, examples."""

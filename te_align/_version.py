"""te-align's version, at the lowest floor (the public API re-exports it; modules below it read it here)."""

__version__ = "0.1.0"

"""te-align's tests: a regular package, so ``tests.*`` imports resolve here even when a checkout on sys.path (ComfyUI)
has a ``tests`` package of its own."""

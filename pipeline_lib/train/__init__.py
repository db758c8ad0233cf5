"""Code that runs inside the training subprocess (entry, CPU wrappers, model I/O)."""

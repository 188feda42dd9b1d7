"""method=scalar_mix (deepen_run/methods/__init__.py says what a method's folder holds)."""

"""deepen-run: config-driven GLUE experiments on BERT-style encoders (HIRE, PALs, layer duplication)."""

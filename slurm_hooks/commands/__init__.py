"""Click commands, one module per command family; thin wrappers over ``hooks``."""

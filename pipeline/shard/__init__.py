"""Stage 1: raw corpus -> vocabulary + WebDataset shards (see docs/architecture.md)."""
